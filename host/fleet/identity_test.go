package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

func TestHostNames(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"host-a", true}, {"a", true}, {"h0st-9", true}, {strings.Repeat("a", 63), true},
		{"host_a", false}, {"Host-A", false}, {"-a", false}, {"a-", false}, {"", false},
		{strings.Repeat("a", 64), false}, {"a.b", false}, {"a b", false},
	} {
		if err := fleetstate.ValidHostName(c.name); (err == nil) != c.ok {
			t.Errorf("fleetstate.ValidHostName(%q) = %v, want ok=%v", c.name, err, c.ok)
		}
	}
	// Over valid names the stream name is injective: '-' becomes '_',
	// which no valid name holds, and upper case, which none holds either.
	seen := map[string]string{}
	for _, n := range []string{"host-a", "hosta", "host-a-b", "host-ab", "hos-ta", "a-b-c", "ab-c"} {
		s := MirrorStream(n)
		if prev, ok := seen[s]; ok {
			t.Fatalf("%q and %q share stream %s", prev, n, s)
		}
		seen[s] = n
	}
	for in, want := range map[string]string{
		"Host_A.example.com": "host-a", "web01": "web01", "--x--": "x", "": "host", "é": "host",
		strings.Repeat("b", 70): strings.Repeat("b", 63),
	} {
		got := fleetstate.HostNameFrom(in)
		if got != want {
			t.Errorf("fleetstate.HostNameFrom(%q) = %q, want %q", in, got, want)
		}
		if err := fleetstate.ValidHostName(got); err != nil {
			t.Errorf("fleetstate.HostNameFrom(%q) = %q is not valid: %v", in, got, err)
		}
	}
}

// Two hosts that chose one name: the second is refused at Open, in one
// line, and the first's mirror holds only the first's events.
func TestMirrorRefusesAnotherHostsStream(t *testing.T) {
	leafPort := freePort(t)
	fleet := startFleet(t, t.TempDir(), freePort(t), leafPort)
	defer fleet.Shutdown()
	a, m, err := openHost(t, "host-a", ulid.Make().String(), nil, leafPort)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, a, 0, 3)
	awaitMirrored(t, fleet, m.StreamName(), 3)

	_, second, err := openHost(t, "host-a", ulid.Make().String(), nil, leafPort)
	err = refusal(t, second, err)
	if !errors.Is(err, ErrHostTaken) {
		t.Fatalf("a second host named host-a opened: %v", err)
	}
	if strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "NEXUS_HOST_A") {
		t.Fatalf("refusal is not one line naming the stream: %q", err)
	}
	// The same identity reopening (a restart) is not a collision.
	got := mirrored(t, fleet, m.StreamName())
	if len(got) != 3 {
		t.Fatalf("host-a's mirror holds %d messages, want 3", len(got))
	}
}

// refusal is the refusal of a host's mirror: Open's error, or, when the
// fleet answered after Open returned, what Refused delivers (a
// bounded wait: a mirror never refused fails the test).
func refusal(t *testing.T, m *Mirror, err error) error {
	t.Helper()
	if err != nil {
		return err
	}
	refused, _ := m.Refused()
	select {
	case <-refused:
		_, err := m.Refused()
		return err
	case <-time.After(testutil.Scale(30 * time.Second)):
		ok, last := m.Status()
		t.Fatalf("the mirror was never refused (status %v, last error %q)", ok, last)
		return nil
	}
}

// A refusal the fleet gives after Open returned is delivered all the
// same: Open waits only StartWait for the fleet, and a host that went on
// past it must still learn the name is another's.
func TestMirrorRefusedAfterOpen(t *testing.T) {
	leafPort := freePort(t)
	fleet := startFleet(t, t.TempDir(), freePort(t), leafPort)
	defer fleet.Shutdown()
	_, m := openMirrored(t, leafPort)
	awaitCreated(t, fleet, m.StreamName())

	u, _ := url.Parse(fmt.Sprintf("nats-leaf://%s:%s@127.0.0.1:%d", leafUser, leafPass, leafPort))
	late := &Mirror{URLs: []*url.URL{u}, Domain: fleetDomain, Host: "host-a", HostID: ulid.Make().String(),
		Check: 200 * time.Millisecond, StartWait: time.Nanosecond}
	j, err := journal.Open(context.Background(), journal.Options{Dir: filepath.Join(t.TempDir(), "journal"), Mirror: late})
	if err != nil {
		// The fleet answered within a nanosecond: nothing left to test.
		t.Skipf("refused at Open: %v", err)
	}
	defer j.Close()
	err = refusal(t, late, nil)
	if !errors.Is(err, ErrHostTaken) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "NEXUS_HOST_A is the mirror of host") {
		t.Fatalf("late refusal: %v", err)
	}
	if _, last := late.Status(); last != err.Error() {
		t.Fatalf("status after the refusal says %q, want %q", last, err)
	}
	if got := mirrored(t, fleet, m.StreamName()); len(got) != 0 {
		t.Fatalf("the first host's empty mirror holds %d messages after the refusal", len(got))
	}
}

// Many hosts on one hub: distinct server names mean no host's link evicts
// another's, so every mirror fills and every link stays up.
func TestMirrorHostsDoNotEvictEachOther(t *testing.T) {
	leafPort := freePort(t)
	fleet := startFleet(t, t.TempDir(), freePort(t), leafPort)
	defer fleet.Shutdown()
	const hosts = 4
	var js []*journal.Journal
	var ms []*Mirror
	for i := range hosts {
		j, m, err := openHost(t, "host-"+string(rune('a'+i)), ulid.Make().String(), nil, leafPort)
		if err != nil {
			t.Fatal(err)
		}
		js, ms = append(js, j), append(ms, m)
	}
	for i, j := range js {
		appendN(t, j, 0, 5)
		awaitMirrored(t, fleet, ms[i].StreamName(), 5)
	}
	// An eviction shows as the hub's leaf count dropping below the hosts.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if n := fleet.NumLeafNodes(); n != hosts {
			t.Fatalf("hub has %d leaf links, want %d: a host's link was dropped", n, hosts)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A mirror deleted on the fleet comes back, and the daemon's log says so;
// an operator's replicas/limit change is kept and reported, not reset.
func TestMirrorRecreatedAndOperatorSettingsKept(t *testing.T) {
	leafPort, clientPort := freePort(t), freePort(t)
	fleet := startFleet(t, t.TempDir(), clientPort, leafPort)
	defer fleet.Shutdown()
	var logs testutil.Buffer
	j, m, err := openHost(t, "host-a", ulid.Make().String(), slog.New(slog.NewTextHandler(&logs, nil)), leafPort)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, j, 0, 4)
	awaitMirrored(t, fleet, m.StreamName(), 4)
	awaitReported(t, fleet, m.StreamName(), 4)

	nc, js := connectJS(t, fleet.ClientURL())
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(30*time.Second))
	defer cancel()
	// The operator limits the mirror; the daemon must not undo it.
	limitMirror(ctx, t, js, m.StreamName())
	waitLog(t, &logs, "mirror.settings-differ")
	// A restart of the host (same root, same identity) keeps it too.
	dir := j.Dir()
	j.Close()
	var logs2 testutil.Buffer
	j, err = journal.Open(context.Background(), journal.Options{Dir: dir, Mirror: m, Logger: slog.New(slog.NewTextHandler(&logs2, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	waitLog(t, &logs2, "mirror.settings-differ")
	if s, err := js.Stream(ctx, m.StreamName()); err != nil {
		t.Fatal(err)
	} else if s.CachedInfo().Config.MaxBytes != 1<<30 {
		t.Fatalf("operator's limit reset to %d", s.CachedInfo().Config.MaxBytes)
	}

	if err := js.DeleteStream(ctx, m.StreamName()); err != nil {
		t.Fatal(err)
	}
	got := awaitMirrored(t, fleet, m.StreamName(), 4)
	if len(got) != 4 {
		t.Fatalf("re-created mirror holds %d, want 4", len(got))
	}
	waitLog(t, &logs2, "mirror.recreated")
	if strings.Contains(logs.String()+logs2.String(), leafPass) {
		t.Fatal("the log holds the fleet password")
	}
	if !strings.Contains(logs.String(), "mirror.linked") {
		t.Fatalf("no mirror.linked in the log:\n%s", logs.String())
	}
}

func waitLog(t *testing.T, logs *testutil.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(testutil.Scale(15 * time.Second))
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in the log:\n%s", want, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestMirrorMisconfigurationRefusedAtOpen(t *testing.T) {
	dir := t.TempDir()
	_, _, err := openHostCreds(t, dir+"/missing.creds")
	if err == nil || !strings.Contains(err.Error(), "missing.creds") {
		t.Fatalf("a missing creds file opened: %v", err)
	}
	for _, bad := range []string{"http://u:pw@h:1", "nats-leaf://u:pw@:4222", "nats-leaf://u:pw@h:99999", "::nope"} {
		_, err := fleetstate.ParseURL(bad)
		if err == nil {
			t.Fatalf("fleetstate.ParseURL(%q) accepted", bad)
		}
		if strings.Contains(err.Error(), "pw") {
			t.Fatalf("fleetstate.ParseURL(%q) error shows the password: %v", bad, err)
		}
	}
}

func openHostCreds(t *testing.T, creds string) (*journal.Journal, *Mirror, error) {
	t.Helper()
	u, _ := fleetstate.ParseURL("nats-leaf://127.0.0.1:1")
	m := &Mirror{URLs: []*url.URL{u}, Credentials: creds, Domain: fleetDomain, Host: "host-a", HostID: ulid.Make().String()}
	j, err := journal.Open(context.Background(), journal.Options{Dir: t.TempDir() + "/journal", Mirror: m})
	if err == nil {
		j.Close()
	}
	return j, m, err
}

// Several fleet URLs: the first node is down at start, the link fails
// over to the next.
func TestMirrorFailsOverToTheNextURL(t *testing.T) {
	leafPort := freePort(t)
	fleet := startFleet(t, t.TempDir(), freePort(t), leafPort)
	defer fleet.Shutdown()
	j, m, err := openHost(t, "host-a", ulid.Make().String(), nil, freePort(t), leafPort)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, j, 0, 3)
	awaitMirrored(t, fleet, m.StreamName(), 3)
}

// An empty mirror is not a verified journal.
func TestReadMirrorRefusesAnEmptyMirror(t *testing.T) {
	leafPort := freePort(t)
	fleet := startFleet(t, t.TempDir(), freePort(t), leafPort)
	defer fleet.Shutdown()
	_, m := openMirrored(t, leafPort)
	awaitCreated(t, fleet, m.StreamName())
	err := ReadMirror(context.Background(), fleet.ClientURL(), "", "", m.StreamName(), func(journal.Record) error { return nil }, nil)
	if err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("an empty mirror read without complaint: %v", err)
	}
}

// A fleet that refuses the link's password, or whose account cannot hold
// the mirror, is an error at Open, not a daemon that says it mirrors.
func TestMirrorRefusalsAtOpen(t *testing.T) {
	leafPort := freePort(t)
	fleet := startFleet(t, t.TempDir(), freePort(t), leafPort)
	defer fleet.Shutdown()
	u, _ := url.Parse(fmt.Sprintf("nats-leaf://%s:%s@127.0.0.1:%d", leafUser, "wrong-pw", leafPort))
	m := &Mirror{URLs: []*url.URL{u}, Domain: fleetDomain, Host: "host-a", HostID: ulid.Make().String()}
	_, err := journal.Open(context.Background(), journal.Options{Dir: filepath.Join(t.TempDir(), "journal"), Mirror: m})
	if err == nil || !strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), "wrong-pw") {
		t.Fatalf("a refused password opened (or was shown): %v", err)
	}

	// An account that demands a byte limit refuses a mirror made without.
	tmpl := "accounts { LIMITED: { jetstream: { max_file: 1G, max_bytes_required: true }, users: [{user: h, password: p}] } }\n"
	c := startCluster(t, tmpl)
	_, _, err = openHostAt(t, "host-a", c.urls("h", "p"), 0)
	if err == nil || !strings.Contains(err.Error(), "max bytes") {
		t.Fatalf("a mirror without the account's required limit: %v", err)
	}
	if _, _, err := openHostAt(t, "host-b", c.urls("h", "p"), 1<<20); err != nil {
		t.Fatalf("with --mirror-max-bytes the account takes it: %v", err)
	}
}

func openHostAt(t *testing.T, name string, urls []*url.URL, maxBytes int64) (*journal.Journal, *Mirror, error) {
	t.Helper()
	m := &Mirror{URLs: urls, Domain: fleetDomain, Host: name, HostID: ulid.Make().String(), MaxBytes: maxBytes, StartWait: 20 * time.Second}
	j, err := journal.Open(context.Background(), journal.Options{Dir: filepath.Join(t.TempDir(), "journal"), Mirror: m})
	if err == nil {
		t.Cleanup(func() { j.Close() })
	}
	return j, m, err
}
