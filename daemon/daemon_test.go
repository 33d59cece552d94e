package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/store"
)

// running is a daemon.Run in this process on its own state root.
type running struct {
	root   string
	status wire.Status
	cancel context.CancelFunc
	done   chan error
}

func startDaemon(t *testing.T, listen string) *running {
	t.Helper()
	return startDaemonAt(t, t.TempDir(), listen)
}

// startDaemonAt runs Run on root until the test ends, and returns
// once Ready has been called.
func startDaemonAt(t *testing.T, root, listen string) *running {
	t.Helper()
	return startDaemonWith(t, root, daemon.Options{Listen: listen})
}

// startDaemonWith is startDaemonAt with every option (Ready is its own).
func startDaemonWith(t *testing.T, root string, o daemon.Options) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &running{root: root, cancel: cancel, done: make(chan error, 1)}
	ready := make(chan wire.Status, 1)
	go func() {
		o.Ready = func(st wire.Status) { ready <- st }
		d.done <- daemon.Run(ctx, root, o)
	}()
	t.Cleanup(func() {
		cancel()
		<-d.done
	})
	select {
	case d.status = <-ready:
	case err := <-d.done:
		d.done <- err
		t.Fatalf("daemon exited before it was ready: %v", err)
	case <-time.After(testutil.Scale(30 * time.Second)):
		t.Fatal("daemon not ready after 30s")
	}
	return d
}

// stop cancels the daemon and returns what Run returned.
func (d *running) stop(t *testing.T) error {
	t.Helper()
	d.cancel()
	select {
	case err := <-d.done:
		d.done <- err
		return err
	case <-time.After(testutil.Scale(30 * time.Second)):
		t.Fatal("daemon did not stop within 30s of its context being cancelled")
		return nil
	}
}

func connect(t *testing.T, root string) control.Backend {
	t.Helper()
	b, err := local.Connect(context.Background(), root, 5*time.Second)
	if err != nil {
		t.Fatalf("Connect %s: %v", root, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func volumeEvent(i int) events.Event {
	return events.New(ulid.Make(), time.Now(), "", events.VolumeCreatedEvent{
		Name: "vol-" + string(rune('a'+i%26)), Path: "/var/lib/nexus/volumes/x", SizeBytes: int64(i) << 20,
	})
}

func allEvents(t *testing.T, b control.Backend) []store.Record {
	t.Helper()
	var out []store.Record
	if err := b.Events(context.Background(), store.Query{}, func(r store.Record) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatalf("Events: %v", err)
	}
	return out
}

func TestDaemonServesClients(t *testing.T) {
	d := startDaemon(t, "")
	if d.status.Pid != os.Getpid() || d.status.SubscriberURL != "" {
		t.Fatalf("Ready status = %+v; want this pid and no subscriber URL without --listen", d.status)
	}
	if _, err := os.Stat(filepath.Join(d.root, daemon.SubscriberFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s without --listen: %v, want it absent", daemon.SubscriberFile, err)
	}

	b := connect(t, d.root)
	// A Local here would mean Connect opened the store beside the daemon.
	c, ok := b.(*control.Client)
	if !ok {
		t.Fatalf("Connect with a daemon running returned %T, want *control.Client", b)
	}
	st, err := c.Status(context.Background())
	if err != nil || st.Pid != os.Getpid() || st.Root != d.status.Root {
		t.Fatalf("Status through the socket = %+v, %v; want %+v", st, err, d.status)
	}

	sandbox := ulid.Make().String()
	want := []events.Event{
		events.New(ulid.Make(), time.Now(), sandbox, events.SandboxCreatedEvent{Handle: "web", Image: "alpine:3", Driver: "fake"}),
		volumeEvent(1),
		volumeEvent(2),
	}
	seqs, err := b.Append(context.Background(), want...)
	if err != nil {
		t.Fatalf("Append through the daemon: %v", err)
	}
	if len(seqs) != 3 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 {
		t.Fatalf("Append seqs = %v, want [1 2 3]", seqs)
	}
	got := allEvents(t, b)
	if len(got) != len(want) {
		t.Fatalf("Events returned %d records, want %d", len(got), len(want))
	}
	for i, r := range got {
		if r.Seq != uint64(i+1) || r.Event.ID != want[i].ID || r.Event.Type != want[i].Type {
			t.Fatalf("record %d = seq %d %s %s; want seq %d %s %s", i, r.Seq, r.Event.ID, r.Event.Type, i+1, want[i].ID, want[i].Type)
		}
	}

	list, err := b.Sandboxes(context.Background())
	if err != nil {
		t.Fatalf("Sandboxes: %v", err)
	}
	if len(list) != 1 || list[0].ID != sandbox || list[0].Handle != "web" || list[0].Image != "alpine:3" {
		t.Fatalf("Sandboxes = %+v, want the one sandbox %s (web, alpine:3)", list, sandbox)
	}

	// A second client is another connection to the same owner, not a second
	// opener: it sees the first client's appends.
	if b2 := connect(t, d.root); len(allEvents(t, b2)) != 3 {
		t.Fatal("second client does not see the first client's events")
	} else if _, ok := b2.(*control.Client); !ok {
		t.Fatalf("second Connect returned %T, want *control.Client", b2)
	}
}

func readSubscriber(t *testing.T, root string) daemon.SubscriberCredentials {
	t.Helper()
	path := filepath.Join(root, daemon.SubscriberFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("%s: %v", daemon.SubscriberFile, err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Fatalf("%s has mode %04o, want 0600", daemon.SubscriberFile, mode)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c daemon.SubscriberCredentials
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", daemon.SubscriberFile, err)
	}
	if c.User == "" || c.Password == "" || c.URL == "" {
		t.Fatalf("%s lacks user, password or url: %s", daemon.SubscriberFile, data)
	}
	return c
}

// dialSubscriber connects as an external subscriber would, retrying only a
// handshake that did not finish. The server checks a bcrypt hash inside the
// handshake and gives the whole of it about two seconds (its auth timeout
// and first PING), which a CPU-starved host running -race can exceed before
// the server has said yes or no. An answer, refusal included, is returned
// at once.
func dialSubscriber(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	opts = append(opts, nats.NoReconnect(), nats.Timeout(30*time.Second))
	deadline := time.Now().Add(testutil.Scale(time.Minute))
	for {
		nc, err := nats.Connect(url, opts...)
		if err == nil || errors.Is(err, nats.ErrAuthorization) || time.Now().After(deadline) {
			return nc, err
		}
		t.Logf("subscriber handshake did not complete, retrying: %v", err)
	}
}

func TestDaemonSubscribers(t *testing.T) {
	d := startDaemon(t, "127.0.0.1:0")
	creds := readSubscriber(t, d.root)
	if creds.URL != d.status.SubscriberURL {
		t.Fatalf("%s url %q, Ready said %q", daemon.SubscriberFile, creds.URL, d.status.SubscriberURL)
	}
	if !strings.Contains(creds.URL, "127.0.0.1:") {
		t.Fatalf("subscriber url %q is not on the loopback listener", creds.URL)
	}
	b := connect(t, d.root)

	t.Run("wrong password refused", func(t *testing.T) {
		nc, err := dialSubscriber(t, creds.URL, nats.UserInfo(creds.User, creds.Password+"x"))
		if err == nil {
			nc.Close()
			t.Fatal("connect with a wrong password succeeded")
		}
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connect with a wrong password: %v, want %v", err, nats.ErrAuthorization)
		}
	})

	asyncErrs := make(chan error, 16)
	nc, err := dialSubscriber(t, creds.URL, nats.UserInfo(creds.User, creds.Password),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case asyncErrs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("subscriber connect: %v", err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync(events.SubjectPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	// Flush round-trips to the server, so the subscription is in place
	// before the first append.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	const n = 20
	var want []events.Event
	for i := range n {
		e := volumeEvent(i)
		if _, err := b.Append(context.Background(), e); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		want = append(want, e)
	}
	for i := range n {
		msg, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("subscriber got %d of %d events: %v", i, n, err)
		}
		e, err := events.Decode(msg.Data)
		if err != nil {
			t.Fatalf("subscriber event %d does not decode: %v", i, err)
		}
		if e.ID != want[i].ID {
			t.Fatalf("subscriber event %d is %s, want %s (order or content differs)", i, e.ID, want[i].ID)
		}
		if subj, _ := want[i].Subject(); msg.Subject != subj {
			t.Fatalf("subscriber event %d on %q, want %q", i, msg.Subject, subj)
		}
		if seq := msg.Header.Get("Nats-Sequence"); seq != strconv.Itoa(i+1) {
			t.Fatalf("subscriber event %d carries journal sequence %q, want %d", i, seq, i+1)
		}
	}

	before := len(allEvents(t, b))
	forged, err := events.Encode(volumeEvent(99))
	if err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{events.VolumeSubject(events.VolumeCreated, "x"), "nexus.events.volume.created._", "nexus.events.sandbox.created._", "$JS.API.STREAM.DELETE.NEXUS"} {
		if err := nc.Publish(subject, forged); err != nil {
			t.Fatalf("publish %s: %v", subject, err)
		}
		select {
		case err := <-asyncErrs:
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
				t.Fatalf("publish to %s: async error %v, want a permissions violation naming it", subject, err)
			}
		case <-time.After(testutil.Scale(10 * time.Second)):
			t.Fatalf("publish to %s by the subscriber was not refused within 10s", subject)
		}
	}
	if !nc.IsConnected() {
		t.Fatal("subscriber connection dropped after refused publishes")
	}
	// The journal is unchanged and its stream still exists: a further
	// append lands at the next sequence and reaches the subscriber.
	if after := len(allEvents(t, b)); after != before {
		t.Fatalf("journal has %d events after refused publishes, had %d", after, before)
	}
	last := volumeEvent(100)
	seqs, err := b.Append(context.Background(), last)
	if err != nil || len(seqs) != 1 || seqs[0] != uint64(before+1) {
		t.Fatalf("append after refused publishes = %v, %v; want seq %d", seqs, err, before+1)
	}
	msg, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("subscriber after refused publishes: %v", err)
	}
	if e, err := events.Decode(msg.Data); err != nil || e.ID != last.ID {
		t.Fatalf("subscriber got %v, %v after refused publishes; want %s (a forged event leaked?)", e.ID, err, last.ID)
	}

	t.Run("exits reach subscribers", func(t *testing.T) {
		sb := ulid.Make().String()
		vmm, sup := startSleeper(t), startSleeper(t)
		if _, err := b.Append(context.Background(),
			events.New(ulid.Make(), time.Now(), sb, events.SandboxCreatedEvent{Image: "i", Driver: "process"}),
			events.New(ulid.Make(), time.Now(), sb, events.SupervisorStartedEvent{Pid: sup.id.Pid, Start: sup.id.StartTicks}),
			events.New(ulid.Make(), time.Now(), sb, events.SandboxStartedEvent{Driver: "process", VMMPid: vmm.id.Pid, VMMStart: vmm.id.StartTicks}),
		); err != nil {
			t.Fatal(err)
		}
		// The daemon runs in this process, so it is the sleepers' parent
		// and knows how they ended.
		sup.kill(t)
		got := nextOfType(t, sub, events.SupervisorExited)
		if x := got.Payload.(events.SupervisorExitedEvent); got.Sandbox != sb || x.Pid != sup.id.Pid || x.StartTicks != sup.id.StartTicks || x.Status != events.ExitKilled || x.Signal != "SIGKILL" {
			t.Fatalf("supervisor.exited = %+v of %s", x, got.Sandbox)
		}
		vmm.kill(t)
		got = nextOfType(t, sub, events.VMMExited)
		if x := got.Payload.(events.VMMExitedEvent); got.Sandbox != sb || x.Pid != vmm.id.Pid || x.StartTicks != vmm.id.StartTicks || x.Status != events.ExitKilled || x.Code != 9 || x.By != "daemon" {
			t.Fatalf("vmm.exited = %+v of %s", x, got.Sandbox)
		}
		list, err := b.Sandboxes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].State != projections.StateExited || list[0].VMM == nil || !list[0].VMM.Exited || !list[0].Supervisor.Exited {
			t.Fatalf("after the exits the daemon serves %+v; want the sandbox exited, its processes kept and marked", list)
		}
	})

	t.Run("history not reachable", func(t *testing.T) {
		// The subscriber may not create consumers, so it cannot read the
		// stream behind nexus's back.
		_, err := nc.Request("$JS.API.STREAM.INFO.NEXUS", nil, time.Second)
		if err == nil {
			t.Fatal("subscriber reached the JetStream API")
		}
		select {
		case err := <-asyncErrs:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Fatalf("JetStream API request: async error %v, want a permissions violation", err)
			}
		case <-time.After(testutil.Scale(10 * time.Second)):
			t.Fatalf("JetStream API request failed with %v but the server reported no permissions violation", err)
		}
	})

	// Credentials survive a restart: the same file, the same password.
	if err := d.stop(t); err != nil {
		t.Fatalf("daemon: %v", err)
	}
	d2 := startDaemonAt(t, d.root, "127.0.0.1:0")
	if again := readSubscriber(t, d2.root); again.User != creds.User || again.Password != creds.Password {
		t.Fatal("restarted daemon regenerated the subscriber credentials")
	}
}

func TestDaemonRefusesRemoteListen(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", "192.0.2.1:0", ":0"} {
		root := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		readyCalled := false
		err := daemon.Run(ctx, root, daemon.Options{
			Listen: addr,
			Ready:  func(wire.Status) { readyCalled = true },
		})
		cancel()
		if err == nil || readyCalled {
			t.Fatalf("--listen %s without AllowRemote: err %v, ready %v; want a refusal", addr, err, readyCalled)
		}
		if !strings.Contains(err.Error(), "loopback") {
			t.Fatalf("--listen %s refused with %v; want it to say the address is not loopback", addr, err)
		}
		// Allowed beyond loopback, but not in clear.
		err = daemon.Run(context.Background(), root, daemon.Options{Listen: addr, AllowRemote: true})
		if err == nil || !strings.Contains(err.Error(), "--tls-cert") {
			t.Fatalf("--listen %s --allow-remote without TLS: %v; want a refusal naming --tls-cert", addr, err)
		}
		// Refused before anything was created: no credentials, no journal.
		for _, name := range []string{daemon.SubscriberFile, "journal", wire.SocketName} {
			if _, err := os.Stat(filepath.Join(root, name)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("--listen %s refused, but %s exists (%v)", addr, name, err)
			}
		}
	}
}

func TestDaemonShutdown(t *testing.T) {
	d := startDaemon(t, "127.0.0.1:0")
	sock := filepath.Join(d.root, wire.SocketName)
	b := connect(t, d.root)
	if _, ok := b.(*control.Client); !ok {
		t.Fatalf("Connect with a daemon running returned %T, want *control.Client", b)
	}
	e := volumeEvent(0)
	if _, err := b.Append(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	b.Close()

	if err := d.stop(t); err != nil {
		t.Fatalf("Run after cancel: %v, want nil", err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after shutdown: %v, want it removed", wire.SocketName, err)
	}

	// With no daemon, Connect owns the store itself, at once: the daemon
	// released the lock before Run returned.
	l := connect(t, d.root)
	local, ok := l.(local.Backend)
	if !ok {
		t.Fatalf("Connect after shutdown returned %T, want local.Backend", l)
	}
	got := allEvents(t, local)
	if len(got) != 1 || got[0].Event.ID != e.ID {
		t.Fatalf("events after shutdown = %+v, want the one appended through the daemon", got)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a local Connect created %s: %v", wire.SocketName, err)
	}
}

// One sandbox is read by id or handle, with or without a daemon, without
// listing every sandbox.
func TestSandboxByRef(t *testing.T) {
	for _, viaDaemon := range []bool{false, true} {
		root := t.TempDir()
		n, err := store.Open(context.Background(), root, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		id := ulid.Make().String()
		e := events.New(ulid.Make(), time.Now(), id, events.SagaStartedEvent{Kind: "create"})
		e.Saga = ulid.Make().String()
		h := events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Handle: "a/b"})
		h.Saga = e.Saga
		if _, err := n.Append(context.Background(), e, h); err != nil {
			t.Fatal(err)
		}
		var b control.Backend = local.Backend{Store: n}
		if viaDaemon {
			ctx, cancel := context.WithCancel(context.Background())
			go daemon.Serve(ctx, n)
			defer cancel()
			c := control.NewClient(filepath.Join(root, wire.SocketName))
			for i := 0; i < 500; i++ {
				if _, err := c.Status(context.Background()); err == nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			b = c
		}
		for _, ref := range []string{id, strings.ToLower(id), "a/b"} {
			sb, found, err := b.Sandbox(context.Background(), ref)
			if err != nil || !found || sb.ID != id {
				t.Fatalf("daemon=%v Sandbox(%q) = %+v %v %v", viaDaemon, ref, sb.ID, found, err)
			}
		}
		if _, found, err := b.Sandbox(context.Background(), "a_b"); err != nil || found {
			t.Fatalf("daemon=%v unknown handle found=%v err=%v", viaDaemon, found, err)
		}
		n.Close()
	}
}

// sleeper is a child process standing in for a VMM or supervisor.
type sleeper struct {
	cmd *exec.Cmd
	id  proc.Identity
}

func startSleeper(t *testing.T) *sleeper {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	id, err := proc.Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return &sleeper{cmd, id}
}

func (s *sleeper) kill(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// nextOfType reads the subscription until an event of type typ arrives.
// The minute is a guard against hanging, not a timing assertion.
func nextOfType(t *testing.T, sub *nats.Subscription, typ events.Type) events.Event {
	t.Helper()
	deadline := time.Now().Add(testutil.Scale(time.Minute))
	for {
		msg, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("no %s event reached the subscriber: %v", typ, err)
		}
		e, err := events.Decode(msg.Data)
		if err != nil {
			t.Fatalf("subscriber event does not decode: %v", err)
		}
		if e.Type == typ {
			return e
		}
	}
}

// waitEvents follows the journal until want events of type typ have been
// seen, and returns them. The minute is a guard against hanging.
func waitEvents(t *testing.T, b control.Backend, typ events.Type, want int) []events.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []events.Event
	errEnough := errors.New("enough")
	err := b.Events(ctx, store.Query{Type: string(typ), Follow: true}, func(r store.Record) error {
		got = append(got, r.Event)
		if len(got) == want {
			return errEnough
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("%d of %d %s events in the journal: %v", len(got), want, typ, err)
	}
	return got
}

// TestDaemonWatchesProcessesRecordedBeforeItStarted: a daemon watches the
// VMMs the journal recorded before it started, by pid + start time: one
// that died while no daemon ran is journaled at start-up (its status
// unknown: it was reaped already), one that dies later when it dies.
func TestDaemonWatchesProcessesRecordedBeforeItStarted(t *testing.T) {
	root := t.TempDir()
	early, late := startSleeper(t), startSleeper(t)
	sbEarly, sbLate := ulid.Make().String(), ulid.Make().String()
	b := connect(t, root)
	if _, ok := b.(local.Backend); !ok {
		t.Fatalf("no daemon yet, but Connect returned %T", b)
	}
	for _, s := range []struct {
		sb string
		p  *sleeper
	}{{sbEarly, early}, {sbLate, late}} {
		if _, err := b.Append(context.Background(),
			events.New(ulid.Make(), time.Now(), s.sb, events.SandboxCreatedEvent{Image: "i", Driver: "process"}),
			events.New(ulid.Make(), time.Now(), s.sb, events.SandboxStartedEvent{Driver: "process", VMMPid: s.p.id.Pid, VMMStart: s.p.id.StartTicks}),
		); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	early.kill(t)
	early.cmd.Wait()

	startDaemonAt(t, root, "")
	c := connect(t, root)
	first := waitEvents(t, c, events.VMMExited, 1)[0]
	if x := first.Payload.(events.VMMExitedEvent); first.Sandbox != sbEarly || x.Pid != early.id.Pid || x.Status != events.ExitUnknown {
		t.Fatalf("first vmm.exited = %+v of %s; want pid %d of %s, status unknown", x, first.Sandbox, early.id.Pid, sbEarly)
	}
	late.kill(t)
	second := waitEvents(t, c, events.VMMExited, 2)[1]
	if x := second.Payload.(events.VMMExitedEvent); second.Sandbox != sbLate || x.Pid != late.id.Pid || x.Status != events.ExitKilled {
		t.Fatalf("second vmm.exited = %+v of %s; want pid %d of %s, killed", x, second.Sandbox, late.id.Pid, sbLate)
	}
	list, err := c.Sandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.State != projections.StateExited {
			t.Fatalf("sandbox %s is %s after its VMM exited, want exited", sb.ID, sb.State)
		}
	}
	if len(list) != 2 {
		t.Fatalf("%d sandboxes after the exits, want both kept", len(list))
	}
}
