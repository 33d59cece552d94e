package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/ledger"
)

// TestAPIOverTheSocket: one client on a root where nobody started a daemon
// creates, lists with filters, reads, execs in, stops, starts, snapshots
// and removes a sandbox, each through the daemon it started on demand;
// the common refusals come back as the typed errors; the events stream
// tells the story; and the CLI sees the same sandboxes.
func TestAPIOverTheSocket(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	c := processClient(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(3*time.Minute))
	defer cancel()
	defer c.Close(context.Background())
	img := image(t)

	sb, err := c.Create(ctx, client.CreateSpec{Image: img, Handle: "web", Labels: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != "running" || !sb.Ready || sb.Handle != "web" || sb.ShortID == "" {
		t.Fatalf("created %+v: want running, Ready, handle web", sb)
	}
	other, err := c.Create(ctx, client.CreateSpec{Image: img, Ready: client.ReadyWait{NoWait: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !liveIDs(t, root)[sb.ID] {
		t.Fatalf("the CLI does not list %s", sb.ID)
	}

	_, err = c.Create(ctx, client.CreateSpec{Image: img, Handle: "web"})
	if !errors.Is(err, client.ErrHandleTaken) || !errors.Is(err, client.ErrRefused) {
		t.Fatalf("a second create with handle web: %v, want ErrHandleTaken", err)
	}
	var oe *client.OpError
	if !errors.As(err, &oe) || oe.Op != "create" || oe.Ref != "web" {
		t.Fatalf("refusal %#v: want an OpError naming create and web", err)
	}
	if _, err := c.Get(ctx, "nosuch"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get nosuch: %v, want ErrNotFound", err)
	}

	all, err := c.List(ctx, client.ListOptions{})
	if err != nil || len(all) != 2 {
		t.Fatalf("list: %v %v, want 2", all, err)
	}
	labelled, err := c.List(ctx, client.ListOptions{Filters: []string{"label=team=a", "state=running"}})
	if err != nil || len(labelled) != 1 || labelled[0].ID != sb.ID {
		t.Fatalf("list label=team=a: %+v %v, want only %s", labelled, err, sb.ID)
	}
	if page, err := c.List(ctx, client.ListOptions{Limit: 1}); err != nil || len(page) != 1 || page[0].ID != min(sb.ID, other.ID) {
		t.Fatalf("list --limit 1: %+v %v", page, err)
	}
	if _, err := c.List(ctx, client.ListOptions{Filters: []string{"colour=red"}}); err == nil {
		t.Fatal("an unknown filter key was taken")
	}
	got, err := c.Get(ctx, sb.ShortID)
	if err != nil || got.ID != sb.ID || got.Labels["team"] != "a" {
		t.Fatalf("get by short ID: %+v %v", got, err)
	}

	var out bytes.Buffer
	st, err := c.Exec(ctx, "web", client.ExecOptions{Argv: []string{"sh", "-c", "echo hello; exit 3"}, Stdout: &out})
	if err != nil || st.Code != 3 || strings.TrimSpace(out.String()) != "hello" {
		t.Fatalf("exec: %+v %v, output %q", st, err, out.String())
	}

	if got, err = c.Stop(ctx, "web"); err != nil || got.State != "stopped" {
		t.Fatalf("stop: %+v %v", got, err)
	}
	if got, err = c.Stop(ctx, "web"); err != nil || got.State != "stopped" {
		t.Fatalf("stop of a stopped sandbox: %+v %v, want it reported, no error", got, err)
	}
	if stopped, err := c.List(ctx, client.ListOptions{Filters: []string{"state=stopped"}}); err != nil || len(stopped) != 1 {
		t.Fatalf("list state=stopped: %+v %v", stopped, err)
	}
	if got, err = c.Start(ctx, "web", client.ReadyWait{}); err != nil || got.State != "running" || !got.Ready {
		t.Fatalf("start: %+v %v", got, err)
	}
	snap, err := c.Snapshot(ctx, "web")
	if err != nil || snap == "" {
		t.Fatalf("snapshot: %q %v", snap, err)
	}

	kids, err := c.Fork(ctx, client.ForkSpec{Parent: "web", Count: 2, Handle: "kid/{n}"})
	if err != nil || len(kids) != 2 || kids[0].Parent != sb.ID || kids[1].Handle != "kid/2" || kids[0].State != "running" {
		t.Fatalf("fork: %+v %v", kids, err)
	}
	bound, _ := os.ReadFile(filepath.Join(root, "runs", c.RunID()+".sandboxes"))
	for _, k := range kids {
		if !strings.Contains(string(bound), k.ID) {
			t.Fatalf("ledger %q does not list the child %s", bound, k.ID)
		}
	}

	var types []string
	err = c.Events(ctx, client.EventQuery{Sandbox: "web", Notable: true}, func(e client.Event) error {
		if e.Sandbox != sb.ID {
			t.Errorf("event %+v of another sandbox", e)
		}
		types = append(types, e.Type)
		return nil
	})
	want := "sandbox.created sandbox.started sandbox.ready sandbox.stopped sandbox.started sandbox.ready snapshot.taken"
	if err != nil || strings.Join(types, " ") != want {
		t.Fatalf("notable events of web: %v %v\nwant %s", types, err, want)
	}

	if err := c.Remove(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, sb.ID); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get after remove: %v, want ErrNotFound", err)
	}
	if err := c.Remove(ctx, "web"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("second remove: %v, want ErrNotFound", err)
	}
	data, _ := os.ReadFile(filepath.Join(root, "runs", c.RunID()+".sandboxes"))
	if strings.Contains(string(data), sb.ID) || !strings.Contains(string(data), other.ID) {
		t.Fatalf("ledger %q: want %s dropped and %s listed", data, sb.ID, other.ID)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(liveIDs(t, root)); n != 0 {
		t.Fatalf("%d sandboxes left after Close", n)
	}
	if _, err := c.List(ctx, client.ListOptions{}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("list after close: %v, want ErrClosed", err)
	}
}

// TestEventsFollow: a follower sees a create made after it started.
func TestEventsFollow(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	c := processClient(t, root)
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	if _, err := c.List(ctx, client.ListOptions{}); err != nil { // the daemon is up
		t.Fatal(err)
	}
	seen := make(chan client.Event, 16)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Events(fctx, client.EventQuery{Types: []string{"sandbox.created"}, Follow: true}, func(e client.Event) error {
			seen <- e
			return nil
		})
	}()
	sb, err := c.Create(ctx, client.CreateSpec{Image: image(t), Ready: client.ReadyWait{NoWait: true}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-seen:
		if e.Sandbox != sb.ID || e.Type != "sandbox.created" || len(e.Data) == 0 {
			t.Fatalf("followed %+v, want sandbox.created of %s", e, sb.ID)
		}
	case <-ctx.Done():
		t.Fatalf("no event followed; daemon log:\n%s", daemonLog(root))
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("follow ended with %v, want context.Canceled", err)
	}
}

// TestDaemonOfAnotherRoot: a root whose socket is a hard link to another
// root's daemon socket is refused with ErrDaemonRoot before any request,
// and nothing is created in either root.
func TestDaemonOfAnotherRoot(t *testing.T) {
	testutil.StartsSandboxes(t)
	a, b := shortRoot(t), shortRoot(t)
	ca, err := client.New(client.Options{Nexus: nexusBin, StateDir: a, Driver: "process"})
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	if _, err := ca.List(ctx, client.ListOptions{}); err != nil { // starts a's daemon
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(a, "nexus.sock"), filepath.Join(b, "nexus.sock")); err != nil {
		t.Fatal(err)
	}
	cb, err := client.New(client.Options{Nexus: nexusBin, StateDir: b, Driver: "process"})
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(context.Background())
	_, err = cb.Create(ctx, client.CreateSpec{Image: image(t), Keep: true})
	if !errors.Is(err, client.ErrDaemonRoot) {
		t.Fatalf("create through another root's daemon: %v, want ErrDaemonRoot", err)
	}
	if list, err := ca.List(ctx, client.ListOptions{}); err != nil || len(list) != 0 {
		t.Fatalf("root a: %+v %v, want no sandbox", list, err)
	}
}

func daemonLog(root string) string {
	data, _ := os.ReadFile(filepath.Join(root, "logs", "daemon.log"))
	return string(data)
}

// TestSweepAfterKilledClient: a client program run without a watchdog
// (NEXUS_REAPER=sweep) is SIGKILLed with live sandboxes, which the daemon
// it started outlives; the next client's init-time sweep removes them.
func TestSweepAfterKilledClient(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	cmd, s := startClient(t, root, 2, "NEXUS_REAPER=sweep")
	t.Cleanup(func() { syscall.Kill(s.Child, syscall.SIGKILL) })
	if s.Watchdog != 0 || len(s.IDs) != 2 {
		t.Fatalf("client started %+v: want 2 sandboxes and no watchdog", s)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	live := liveIDs(t, root)
	for _, id := range s.IDs {
		if !live[id] {
			t.Fatalf("%s gone before any sweep: the test proves nothing", id)
		}
	}
	next, err := client.New(client.Options{Nexus: nexusBin, StateDir: root, Driver: "process", Reaper: ledger.ModeSweep})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	if err := next.Begin(ctx); err != nil || next.SweepErr() != nil {
		t.Fatalf("begin: %v, sweep: %v; daemon log:\n%s", err, next.SweepErr(), daemonLog(root))
	}
	var swept []string
	for _, o := range next.Swept() {
		if o.Run == s.Run {
			swept = o.Removed
		}
	}
	if len(swept) != 2 {
		t.Fatalf("sweep of the killed run: %+v, want its 2 sandboxes removed", next.Swept())
	}
	if list, err := next.List(ctx, client.ListOptions{}); err != nil || len(list) != 0 {
		t.Fatalf("after the sweep: %+v %v, want no sandbox", list, err)
	}
}

// TestCreateTakesTheConfigFile: a client given no driver makes its
// sandbox as the root's config.toml says, as the CLI would: [vm]'s driver
// and sizing are what the sandbox records.
func TestCreateTakesTheConfigFile(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Setenv("NEXUS_DRIVER", "")
	root := shortRoot(t)
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := "[vm]\ndriver = \"process\"\ncpus = 2\nmemory = \"768M\"\n"
	if err := os.WriteFile(filepath.Join(root, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Nexus: nexusBin, StateDir: root})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	defer c.Close(context.Background())
	sb, err := c.Create(ctx, client.CreateSpec{Image: image(t)})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Driver != "process" {
		t.Fatalf("created under %q: want [vm] driver = process", sb.Driver)
	}
	var list []struct {
		Boot struct {
			Cpus        int   `json:"cpus"`
			MemoryBytes int64 `json:"memory_bytes"`
		} `json:"boot"`
	}
	if err := json.Unmarshal([]byte(nexus(t, root, "inspect", "--json", sb.ID)), &list); err != nil || len(list) != 1 {
		t.Fatalf("inspect --json: %v %v", list, err)
	}
	if got := list[0].Boot; got.Cpus != 2 || got.MemoryBytes != 768<<20 {
		t.Fatalf("recorded %d vCPUs and %d bytes: want [vm]'s 2 and 768 MiB", got.Cpus, got.MemoryBytes)
	}

	if err := os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\ncpus = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := client.New(client.Options{Nexus: nexusBin, StateDir: root}); err == nil || !strings.Contains(err.Error(), "cpus = 0") {
		t.Fatalf("a config file with cpus = 0: %v, want it refused naming the setting", err)
	}
}

// TestAPIRestoreRenameLogsVolumes: the rest of the commands through the
// client alone: a restore named and bound to the run (Close removes it),
// a rename that frees the old handle, a log read, and a volume's life.
func TestAPIRestoreRenameLogsVolumes(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	c := processClient(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(3*time.Minute))
	defer cancel()
	sb, err := c.Create(ctx, client.CreateSpec{Image: image(t), Handle: "src"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := c.Snapshot(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	child, err := c.Restore(ctx, client.RestoreSpec{Snapshot: snap, Handle: "copy", Labels: map[string]string{"from": "snap"}})
	if err != nil {
		t.Fatal(err)
	}
	if child.State != "running" || child.Handle != "copy" || child.Snapshot != snap || child.Labels["from"] != "snap" {
		t.Fatalf("restored %+v: want running, handle copy, from %s", child, snap)
	}
	if _, err := c.Restore(ctx, client.RestoreSpec{Snapshot: snap, Handle: "src"}); !errors.Is(err, client.ErrHandleTaken) {
		t.Fatalf("a restore named with a taken handle: %v, want ErrHandleTaken", err)
	}
	if got, err := c.Rename(ctx, "copy", "copy2"); err != nil || got.Handle != "copy2" {
		t.Fatalf("rename: %+v %v", got, err)
	}
	if _, err := c.Get(ctx, "copy"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the old handle after a rename: %v, want ErrNotFound", err)
	}
	var log bytes.Buffer
	if err := c.Logs(ctx, "copy2", client.LogOptions{Kind: "supervisor"}, &log); err != nil || log.Len() == 0 {
		t.Fatalf("supervisor log: %d bytes, %v", log.Len(), err)
	}

	v, err := c.CreateVolume(ctx, "data", 16<<20, map[string]string{"team": "a"})
	if err != nil || v.Name != "data" || v.SizeBytes != 16<<20 {
		t.Fatalf("volume create: %+v %v", v, err)
	}
	if list, err := c.Volumes(ctx); err != nil || len(list) != 1 || list[0].Labels["team"] != "a" {
		t.Fatalf("volumes: %+v %v", list, err)
	}
	if err := c.RemoveVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if list, err := c.Volumes(ctx); err != nil || len(list) != 0 {
		t.Fatalf("volumes after rm: %+v %v", list, err)
	}

	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if live := liveIDs(t, root); len(live) != 0 {
		t.Fatalf("after Close the CLI lists %v: the restored child was not bound to the run", live)
	}
}
