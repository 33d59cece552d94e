package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// Every mirror misconfiguration is a one-line error at daemon start,
// never "mirroring" followed by nothing, and no message shows a password.
func TestDaemonMirrorMisconfiguration(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, c := range []struct {
		args    []string
		code    int
		mention string
	}{
		{[]string{"--mirror", "http://u:pw1@h:4222"}, 2, "scheme"},
		{[]string{"--mirror", "nats-leaf://u:pw1@h:99999"}, 2, "port"},
		{[]string{"--mirror", "nats-leaf://127.0.0.1:7422,nats-leaf://u:pw1@:7422"}, 2, "--mirror"},
		{[]string{"--mirror", "nats-leaf://127.0.0.1:7422", "--mirror-host", "Host_A"}, 2, "--mirror-host"},
		{[]string{"--mirror", "nats-leaf://127.0.0.1:7422", "--mirror-replicas", "9"}, 2, "--mirror-replicas"},
		{[]string{"--mirror", "nats-leaf://127.0.0.1:7422", "--mirror-creds", root + "/no.creds"}, 1, "no.creds"},
	} {
		r := nexus(t, root, append([]string{"daemon"}, c.args...)...)
		wantFailure(t, r, c.code, c.mention)
		if strings.Contains(r.stderr, "pw1") {
			t.Fatalf("%v: the error shows the password: %q", c.args, r.stderr)
		}
	}
	// A password on the command line is warned about (it is readable in
	// /proc/<pid>/cmdline), and still never shown.
	r := nexus(t, root, "daemon", "--mirror", "nats-leaf://u:pw1@127.0.0.1:7422", "--mirror-creds", root+"/no.creds")
	if r.code != 1 || !strings.Contains(r.stderr, "/proc/<pid>/cmdline") || strings.Contains(r.stderr, "pw1") {
		t.Fatalf("password on the command line: exit %d, %q", r.code, r.stderr)
	}
}

func TestFleetTemplateAndStatusErrors(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	r := nexus(t, root, "fleet", "template", "--host", "host-a,host-b", "--host", "host-c")
	if r.code != 0 {
		t.Fatalf("template: exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"NEXUS_HOST_A: {", "NEXUS_HOST_C: {", "$NEXUS_HOST_B_PASSWORD", "NEXUS_AUDIT: {", `"LEAFNODE"`, "STREAM.DELETE"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("template lacks %q:\n%s", want, r.stdout)
		}
	}
	wantFailure(t, nexus(t, root, "fleet", "template"), 2, "host")
	wantFailure(t, nexus(t, root, "fleet", "template", "--host", "Host_A"), 2, "Host_A")
	wantFailure(t, nexus(t, root, "fleet", "template", "--host", "a,a"), 2, "twice")
	wantFailure(t, nexus(t, root, "fleet", "status"), 1, "no daemon")
}

// fleetStatus polls `nexus fleet status --json` until ok accepts it.
func fleetStatus(t *testing.T, root string, ok func(fleet.MirrorState) bool) fleet.MirrorState {
	t.Helper()
	deadline := time.Now().Add(testutil.Scale(60 * time.Second))
	for {
		r := nexus(t, root, "fleet", "status", "--json")
		var st fleet.MirrorState
		if r.code == 0 && json.Unmarshal([]byte(r.stdout), &st) == nil && ok(st) {
			if strings.Contains(r.stdout, "fleet-secret") {
				t.Fatalf("status shows the password: %s", r.stdout)
			}
			checkJSON(t, "fleet status --json as MirrorState", jsonResources["MirrorState"], json.RawMessage(r.stdout))
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet status never as wanted; last: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestFleetStatusThroughDaemon: a daemon mirroring to a real fleet
// server (the URL, with its password, from NEXUS_MIRROR) reports link,
// sequences and lag, and says when the fleet goes away.
func TestFleetStatusThroughDaemon(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	hub, leaf := startFleetServer(t)
	root := shortRoot(t)
	d := mirroringDaemon(t, root, "host-a", leaf, "NEXUS_FLEET_DIGEST_INTERVAL=200ms")
	d.WaitLog(t, 2*time.Minute, `"serving"`)
	logs := &d.Stderr
	mustOK(t, nexus(t, root, "demo"), "demo")

	// The daemon journals its running digest, and the mirror is held to
	// it record by record.
	st := fleetStatus(t, root, func(s fleet.MirrorState) bool {
		return s.Connected && s.Exists && s.JournalLastSeq > 0 && s.MirrorLastSeq == s.JournalLastSeq && s.DigestSeq > 0
	})
	if len(st.FailedChecks) != 0 {
		t.Fatalf("a true mirror failed %v", st.FailedChecks)
	}
	if r := mustOK(t, nexus(t, root, "events"), "events"); strings.Contains(r.stdout, "journal.digest") {
		t.Fatalf("the notable events show the digest:\n%s", r.stdout)
	}
	if st.Host != "host-a" || st.Stream != "NEXUS_HOST_A" || st.LagEvents != 0 || st.Replicas != 1 {
		t.Fatalf("status of a current mirror on a one-node fleet: %+v", st)
	}
	// It names the node the link is up to, as the embedded server sees
	// it, not only the URLs it was given.
	if u, err := fleetstate.ParseURL(leaf); err != nil || st.LinkedNode != "fleet" || st.LinkedAddr != u.Host {
		t.Fatalf("linked to %q at %q, want the fleet server at %s (%v)", st.LinkedNode, st.LinkedAddr, leaf, err)
	}
	id, err := os.ReadFile(filepath.Join(root, "host-id"))
	if err != nil || strings.TrimSpace(string(id)) != st.HostID {
		t.Fatalf("status host id %q, root's host-id %q (%v)", st.HostID, id, err)
	}
	text := mustOK(t, nexus(t, root, "fleet", "status"), "fleet status")
	if !strings.Contains(text.stdout, "connected to fleet at "+st.LinkedAddr) || !strings.Contains(text.stdout, "lag") || !strings.Contains(text.stdout, "digest: ok") {
		t.Fatalf("fleet status text: %q", text.stdout)
	}

	// The mirror audits like the journal.
	mustOK(t, nexus(t, root, "replay", "verify", "--nats", hub.ClientURL(), "--stream", st.Stream), "replay verify of the mirror")

	hub.Shutdown()
	hub.WaitForShutdown()
	fleetStatus(t, root, func(s fleet.MirrorState) bool { return !s.Connected })
	for _, want := range []string{"mirror.created", "mirror.linked", "mirror.unlinked"} {
		waitUntil(t, want, func() bool { return strings.Contains(logs.String(), want) })
	}
	if strings.Contains(logs.String(), "fleet-secret") {
		t.Fatalf("the daemon log shows the password:\n%s", logs.String())
	}
	// The same changes are journaled, once each, the last while the fleet
	// is down; appends do not wait for the fleet.
	mustOK(t, nexus(t, root, "demo"), "demo while the fleet is down")
	var types []string
	waitUntil(t, "mirror.unlinked journaled", func() bool {
		r := nexus(t, root, "events", "--type", "mirror", "--json")
		types = types[:0]
		for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var e struct {
				Type string         `json:"type"`
				Data map[string]any `json:"data"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Type != "" {
				types = append(types, e.Type)
				if e.Data["stream"] != "NEXUS_HOST_A" {
					t.Fatalf("mirror event of another stream: %s", line)
				}
			}
		}
		// The link is sampled each second, so created and linked may
		// come in either order; the link went down after both.
		got := strings.Join(types, " ")
		return r.code == 0 && (got == "mirror.created mirror.linked mirror.unlinked" || got == "mirror.linked mirror.created mirror.unlinked")
	})
	if r := nexus(t, root, "events", "--type", "mirror", "--json"); strings.Contains(r.stdout, "fleet-secret") {
		t.Fatalf("a journaled mirror event shows the password: %s", r.stdout)
	}
}

// mirroringDaemon starts `nexus daemon --mirror-host host` on root, the
// fleet's URLs (with their passwords) in NEXUS_MIRROR; it is stopped when
// the test ends, and each wait on it is bounded.
func mirroringDaemon(t *testing.T, root, host, urls string, env ...string) *testutil.Proc {
	t.Helper()
	d := exec.Command(nexusBin, "--state-dir", root, "daemon", "--mirror-host", host)
	d.Env = append(append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_MIRROR="+urls), env...)
	return testutil.Start(t, d)
}

// startFleetServer runs a one-node fleet in this process: JetStream in
// domain "fleet", a leaf port with a password. It returns the server and
// the leaf URL hosts dial.
func startFleetServer(t *testing.T) (*server.Server, string) {
	t.Helper()
	o := &server.Options{ServerName: "fleet", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, JetStreamDomain: "fleet", StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	// The server picks its leaf port as it binds it: a port picked free
	// beforehand can be taken meanwhile (by one of the daemons' own
	// outgoing links, which draw from the same range).
	o.LeafNode.Host, o.LeafNode.Port = "127.0.0.1", server.RANDOM_PORT
	o.LeafNode.Username, o.LeafNode.Password = "leaf", "fleet-secret"
	fleet, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	fleet.SetLoggerV2(testutil.KeepServerLog(t, "fleet server"), false, false, false)
	fleet.Start()
	t.Cleanup(fleet.Shutdown)
	if !fleet.ReadyForConnections(testutil.Scale(10 * time.Second)) {
		t.Fatal("fleet not ready")
	}
	v, err := fleet.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.LeafNode.Port <= 0 {
		t.Fatalf("fleet's leaf port is %d", v.LeafNode.Port)
	}
	return fleet, fmt.Sprintf("nats-leaf://leaf:fleet-secret@127.0.0.1:%d", v.LeafNode.Port)
}

// A cloned machine with the same host name: its daemon is refused at
// start, in one line, and the first host's mirror is untouched.
func TestDaemonRefusesAnotherHostsName(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	_, leaf := startFleetServer(t)
	first := shortRoot(t)
	mirroringDaemon(t, first, "host-a", leaf).WaitLog(t, 2*time.Minute, "mirror.created")

	r := nexusEnv(t, shortRoot(t), []string{"NEXUS_MIRROR=" + leaf}, "daemon", "--mirror-host", "host-a")
	// A daemon logs as it starts; its failure is the last line, the only error.
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	if r.code != 1 || !strings.HasPrefix(last, "nexus: ") || !strings.Contains(last, "NEXUS_HOST_A is the mirror of host") ||
		strings.Count(r.stderr, "NEXUS_HOST_A is the mirror") != 1 {
		t.Fatalf("second host-a: exit %d, stderr %q", r.code, r.stderr)
	}
	if strings.Contains(r.stderr, "fleet-secret") {
		t.Fatalf("refusal shows the password: %q", r.stderr)
	}
	st := fleetStatus(t, first, func(s fleet.MirrorState) bool { return s.Exists })
	if st.LastError != "" {
		t.Fatalf("the first host's mirror after the refusal: %+v", st)
	}
}

// TestDaemonRefusesAnotherHostsNameWheneverItJoins: daemons of one host
// name join a fleet at offsets around the first one's mirror creation:
// before its link is up, while it is linked but the mirror not yet made,
// as the mirror appears, and after its first report (its report stream). Two
// daemons starting before the name is taken race for it fairly, so the
// rule held is: of the daemons of one name on a fleet, the one whose
// identity the mirror holds serves, and every other exits 1 with the
// one-line refusal, however late the fleet answered it. Each round is one
// fleet, a first daemon and ten more; five rounds shift the offsets.
func TestDaemonRefusesAnotherHostsNameWheneverItJoins(t *testing.T) {
	t.Parallel()
	rounds := 5
	if testing.Short() {
		rounds = 1
	}
	// The rounds run one after another: eleven daemons joining one fleet
	// at once are the load under test, and five fleets at once on a small
	// machine would starve the fleet servers' client handshakes instead.
	for r := range rounds {
		t.Run(fmt.Sprintf("round%d", r), func(t *testing.T) {
			nameRace(t, time.Duration(r)*60*time.Millisecond)
		})
	}
}

// hostAReport is the stream host-a's reports go to.
var hostAReport = fleet.ReportStream("host-a")

// nameRace is one round: a fleet, a first daemon and ten more of its
// name, each offset moved later by shift.
func nameRace(t *testing.T, shift time.Duration) {
	fleet, leaf := startFleetServer(t)
	nc, err := nats.Connect(fleet.ClientURL(), nats.Timeout(testutil.Scale(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// mirror is the fleet's NEXUS_HOST_A as it is now (nil: not made).
	mirror := func() *jetstream.StreamConfig {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, "NEXUS_HOST_A")
		if err != nil {
			return nil
		}
		return &s.CachedInfo().Config
	}
	type daemon struct {
		at   string
		root string
		p    *testutil.Proc
	}
	var all []daemon
	join := func(at string) {
		root := shortRoot(t)
		all = append(all, daemon{at, root, mirroringDaemon(t, root, "host-a", leaf)})
	}
	// Polled tightly, so a daemon joins as close to the moment as a start
	// can be.
	when := func(what string, cond func() bool) {
		testutil.WaitUntil(t, 2*time.Minute, what, func() bool {
			if cond() {
				return true
			}
			time.Sleep(5 * time.Millisecond)
			return false
		})
	}
	join("first")
	time.Sleep(shift)
	join("at the first's start")
	time.Sleep(100 * time.Millisecond)
	join("100ms after the first's start")
	time.Sleep(400 * time.Millisecond)
	join("500ms after the first's start")
	when("a leaf linked to the fleet", func() bool { return fleet.NumLeafNodes() > 0 })
	time.Sleep(shift)
	join("once a leaf linked")
	when("the mirror made", func() bool { return mirror() != nil })
	join("as the mirror appeared")
	time.Sleep(shift)
	join("just after the mirror appeared")
	time.Sleep(300 * time.Millisecond)
	join("300ms after the mirror appeared")
	// The owner reports its journal's last sequence on its first check
	// after creating the mirror.
	when("the owner's first report", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, hostAReport)
		return err == nil && s.CachedInfo().State.Msgs > 0
	})
	join("as the first report appeared")
	time.Sleep(shift)
	join("just after the first report")
	time.Sleep(time.Second)
	join("1s after the first report")

	// The fleet may miss one answer on a loaded machine: ask again.
	var owner string
	when("the mirror's owner", func() bool {
		if m := mirror(); m != nil {
			owner = m.Metadata["nexus_host_id"]
		}
		return owner != ""
	})
	idOf := func(root string) string {
		id, _ := os.ReadFile(filepath.Join(root, "host-id"))
		return strings.TrimSpace(string(id))
	}
	// Every daemon but the owner ends; a bound, not a timing: one still
	// serving past it was not refused.
	settle := time.Now().Add(testutil.Scale(2 * time.Minute))
	for {
		running := 0
		for _, d := range all {
			if !d.p.Exited() {
				running++
			}
		}
		if running <= 1 || time.Now().After(settle) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var slipped []string
	refused := 0
	for _, d := range all {
		mine := idOf(d.root) == owner
		code, exited := d.p.Code()
		switch {
		case mine && exited:
			t.Errorf("the mirror's owner (joined %s) exited %d:\n%s", d.at, code, d.p.Stderr.String())
		case mine:
			t.Logf("the daemon that joined %s owns the name", d.at)
		case !exited:
			slipped = append(slipped, d.at)
			t.Errorf("a second host-a (joined %s) serves on:\n%s", d.at, d.p.Stderr.String())
		default:
			// A daemon logs as it starts; its failure is the last line, the only error.
			stderr := d.p.Stderr.String()
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			last := lines[len(lines)-1]
			if code != 1 || !strings.HasPrefix(last, "nexus: ") || !strings.Contains(last, "NEXUS_HOST_A is the mirror of host") ||
				strings.Count(stderr, "NEXUS_HOST_A is the mirror") != 1 || strings.Contains(stderr, "fleet-secret") {
				t.Errorf("second host-a (joined %s): exit %d, stderr %q", d.at, code, stderr)
				continue
			}
			refused++
		}
	}
	if len(slipped) > 0 {
		t.Errorf("%d of %d daemons not refused, joined: %s", len(slipped), len(all)-1, strings.Join(slipped, "; "))
	}
	if refused != len(all)-1 {
		t.Fatalf("%d of %d daemons refused as they should be", refused, len(all)-1)
	}
	var now *jetstream.StreamConfig
	when("the mirror read again", func() bool { now = mirror(); return now != nil })
	if now.Metadata["nexus_host_id"] != owner {
		t.Fatalf("the mirror changed hands: %+v", now)
	}
}

// A root whose config has a [fleet] section: a plain command's on-demand
// daemon mirrors with the configured name, and config show says where
// each fleet setting came from without the password.
func TestFleetFromConfig(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	_, leaf := startFleetServer(t)
	root := shortRoot(t)
	cfg := fmt.Sprintf("[fleet]\nurls = [%q]\nhost = \"from-config\"\nreplicas = 1\n", leaf)
	if err := os.WriteFile(filepath.Join(root, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	mustOK(t, nexus(t, root, "demo"), "demo")
	st := fleetStatus(t, root, func(s fleet.MirrorState) bool {
		return s.Connected && s.Exists && s.JournalLastSeq > 0 && s.MirrorLastSeq == s.JournalLastSeq
	})
	if st.Host != "from-config" || st.Stream != "NEXUS_FROM_CONFIG" {
		t.Fatalf("the on-demand daemon mirrors as %+v, want host from-config", st)
	}
	show := mustOK(t, nexus(t, root, "config", "show"), "config show").stdout
	if strings.Contains(show, "fleet-secret") || !strings.Contains(show, "fleet.host") || !strings.Contains(show, "from-config") {
		t.Fatalf("config show:\n%s", show)
	}
}

// A changed [fleet] section replaces the on-demand daemon at the next
// plain command, as a new build does: the new daemon mirrors with the new
// name, and the command after it keeps that daemon.
func TestFleetConfigChangeReplacesDaemon(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	_, leaf := startFleetServer(t)
	root := shortRoot(t)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(root, "logs", "daemon.log"))
			t.Logf("daemon log:\n%s", b)
		}
	})
	writeCfg := func(host string) {
		t.Helper()
		cfg := fmt.Sprintf("[fleet]\nurls = [%q]\nhost = %q\nreplicas = 1\n", leaf, host)
		if err := os.WriteFile(filepath.Join(root, "config.toml"), []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	daemonPid := func() int {
		t.Helper()
		r := mustOK(t, nexus(t, root, "daemon", "status", "--json"), "daemon status")
		var st struct {
			Pid int `json:"pid"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Pid <= 0 {
			t.Fatalf("daemon status --json: %v %q", err, r.stdout)
		}
		return st.Pid
	}
	current := func(s fleet.MirrorState) bool {
		return s.Connected && s.Exists && s.JournalLastSeq > 0 && s.MirrorLastSeq == s.JournalLastSeq
	}

	writeCfg("first-name")
	mustOK(t, nexus(t, root, "demo"), "demo")
	if st := fleetStatus(t, root, current); st.Host != "first-name" {
		t.Fatalf("the on-demand daemon mirrors as %+v, want host first-name", st)
	}
	first := daemonPid()

	writeCfg("second-name")
	mustOK(t, nexus(t, root, "demo"), "demo after the config changed")
	second := daemonPid()
	if second == first {
		t.Fatalf("the daemon (pid %d) started with the old [fleet] section still serves", first)
	}
	if st := fleetStatus(t, root, current); st.Host != "second-name" || st.Stream != "NEXUS_SECOND_NAME" {
		t.Fatalf("after the config changed the daemon mirrors as %+v, want host second-name", st)
	}
	// Its fleet settings are the configuration's: nothing replaces it.
	mustOK(t, nexus(t, root, "ls"), "ls")
	if pid := daemonPid(); pid != second {
		t.Fatalf("a daemon with the configured fleet settings (pid %d) was replaced by pid %d", second, pid)
	}
}
