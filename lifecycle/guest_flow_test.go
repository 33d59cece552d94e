package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/host/ext4/ext4test"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

// exec, cp and logs reach a running guest through its agent (the process
// driver's stand-in serves the real guest/agent), and journal nothing.
func TestExecCopyAndLogsOfARunningGuest(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{Handle: "g"})
	mark := f.j.mark()

	var out, errOut bytes.Buffer
	st, err := f.m.Exec(f.ctx, "g", ExecOptions{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, Stdout: &out, Stderr: &errOut})
	if err != nil || st.Code != 3 || out.String() != "out\n" || errOut.String() != "err\n" {
		t.Fatalf("exec: %+v %v, stdout %q, stderr %q", st, err, out.String(), errOut.String())
	}
	_, err = f.m.Exec(f.ctx, "g", ExecOptions{Argv: []string{"no-such-program-here"}, Stdout: &out, Stderr: &errOut})
	var start *ExecStartError
	if !errors.As(err, &start) || !start.NotFound {
		t.Fatalf("exec of a missing program: %v; want an ExecStartError, not found", err)
	}
	if _, err := f.m.Exec(f.ctx, "g", ExecOptions{}); err == nil {
		t.Fatal("exec of no command ran")
	}

	local := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(local, []byte("to the guest"), 0o640)
	if n, err := f.m.CopyIn(f.ctx, "g", local, "/tmp/", nil); err != nil || n != 12 {
		t.Fatalf("cp in: %d, %v", n, err)
	}
	back := t.TempDir()
	if _, err := f.m.CopyOut(f.ctx, "g", "/tmp/in.txt", back, nil); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(back, "in.txt")); string(data) != "to the guest" {
		t.Fatalf("copied back %q", data)
	}
	var piped bytes.Buffer
	if _, err := f.m.CopyOut(f.ctx, "g", "/tmp/in.txt", "-", &piped); err != nil || piped.String() != "to the guest" {
		t.Fatalf("cp out to -: %q, %v", piped.String(), err)
	}
	if _, err := f.m.CopyIn(f.ctx, "g", "-", "/tmp/piped", strings.NewReader("piped")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		err  error
		says string
	}{
		{"relative guest path in", func() error { _, err := f.m.CopyIn(f.ctx, "g", local, "tmp/x", nil); return err }(), "is not absolute"},
		{"relative guest path out", func() error { _, err := f.m.CopyOut(f.ctx, "g", "tmp/x", back, nil); return err }(), "is not absolute"},
		{"a directory in", func() error { _, err := f.m.CopyIn(f.ctx, "g", back, "/tmp/", nil); return err }(), "is not a regular file"},
		{"missing local file", func() error { _, err := f.m.CopyIn(f.ctx, "g", local+".none", "/tmp/", nil); return err }(), "no such file"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.says) {
			t.Errorf("%s: %v; want it to say %q", c.name, c.err, c.says)
		}
	}

	var log bytes.Buffer
	if err := f.m.Logs(f.ctx, "g", LogOptions{Kind: "vmm"}, &log); err != nil || !strings.Contains(log.String(), "vm.boot: ok") {
		t.Fatalf("vmm log %q, %v", log.String(), err)
	}
	if err := f.m.Logs(f.ctx, "g", LogOptions{Kind: "kernel"}, &log); err == nil || !strings.Contains(err.Error(), "want one of") {
		t.Fatalf("log of an unknown kind: %v", err)
	}
	// The first session of a run not yet Ready journals its Ready, once.
	if got := types(f.j.since(mark)); len(got) > 1 || len(got) == 1 && got[0] != "sandbox.ready" {
		t.Fatalf("exec, cp and logs journaled %v, want at most the run's sandbox.ready", got)
	}

	// Followed, a log is copied until its sandbox is removed.
	followed := make(chan error, 1)
	tail := &testutil.Buffer{}
	go func() { followed <- f.m.Logs(f.ctx, sb.ID, LogOptions{Kind: "supervisor", Follow: true}, tail) }()
	testutil.WaitUntil(t, 10*time.Second, "following the supervisor's log", func() bool { return tail.Len() > 0 })
	if _, err := f.m.RemoveWith(f.ctx, sb.ID, RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-followed:
		if err != nil || !strings.Contains(tail.String(), "serving") {
			t.Fatalf("followed log %q, %v", tail.String(), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("following a removed sandbox's log did not end")
	}
}

func TestExecRefusesAGuestThatDoesNotRun(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	stop(f, sb)
	_, err := f.m.Exec(f.ctx, sb.ID, ExecOptions{Argv: []string{"true"}})
	wantErr(t, err, ErrRefused, "is stopped, not running: `nexus start")
	_, err = f.m.CopyOut(f.ctx, sb.ID, "/etc/hostname", "-", &bytes.Buffer{})
	wantErr(t, err, ErrRefused, "not running")
	// A stopped sandbox's log is still there to read.
	var log bytes.Buffer
	if err := f.m.Logs(context.Background(), sb.ID, LogOptions{Kind: "supervisor"}, &log); err != nil || log.Len() == 0 {
		t.Fatalf("log of a stopped sandbox: %q, %v", log.String(), err)
	}
}

// Start prepares the overlay offline before it boots: an acknowledged run
// whose overlay is full is recovered on a private copy (grown, published);
// an unacknowledged one is refused and left untouched until the operator
// accepts it; an overlay that is not ext4 or is missing is refused.
func TestStartPreparesTheOverlay(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		flushed  bool
		spoil    func(t *testing.T, overlay string)
		accept   bool
		reason   string // the refusal's reason; "" boots
		recovers bool
	}{
		{name: "full, flushed", flushed: true, spoil: fill, recovers: true},
		{name: "full, unflushed", spoil: fill, reason: core.ReasonOverlayDiskFull},
		{name: "full, unflushed, accepted", spoil: fill, accept: true, recovers: true},
		{name: "not ext4", flushed: true, spoil: func(t *testing.T, o string) { ext4test.CorruptMagic(t, o) }, reason: core.ReasonProvisioningFailed},
		{name: "missing", flushed: true, spoil: func(t *testing.T, o string) { os.Remove(o) }, reason: core.ReasonOverlayDiskFull},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			testutil.ShortSample(t, c.name == "full, flushed" || c.name == "full, unflushed")
			f := newFlow(t)
			sb := f.create(CreateSpec{})
			if c.flushed {
				stop(f, sb)
			} else {
				kill(t, sb.VMM) // no flush acknowledgement for its run
				stop(f, sb)
			}
			overlay := f.m.Root.WorkspaceDisk(sb.ID)
			c.spoil(t, overlay)
			var sum string
			if _, err := os.Stat(overlay); err == nil {
				sum = ext4test.SHA256(t, overlay)
			}
			mark := f.j.mark()
			_, err := f.m.StartWith(f.ctx, sb.ID, StartOptions{AcceptUnflushed: c.accept})
			evs := f.j.since(mark)
			now, _ := f.find(sb.ID)
			if c.reason != "" {
				var refusal *OverlayRefusal
				if !errors.As(err, &refusal) || refusal.Reason != c.reason || !errors.Is(err, ErrRefused) {
					t.Fatalf("start: %v; want an overlay refusal %s", err, c.reason)
				}
				if sum != "" && ext4test.SHA256(t, overlay) != sum {
					t.Fatal("a refused start changed the overlay")
				}
				if now.State != projections.StateError || !hasCondition(now, c.reason) {
					t.Fatalf("after the refusal: %s, conditions %+v; want error with %s", now.State, now.Conditions, c.reason)
				}
				if f.exists(f.m.rel(f.m.Root.OverlayStaging(sb.ID))) {
					t.Fatal("the private copy outlived the refusal")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := ofType(evs, "overlay.recovered"); (len(got) == 1) != c.recovers {
				t.Fatalf("start journaled %v; overlay recovered: want %v", types(evs), c.recovers)
			}
			if now.State != projections.StateRunning {
				t.Fatalf("%s after start", now.State)
			}
		})
	}
}

func fill(t *testing.T, overlay string) { ext4test.Fill(t, overlay, "filler") }

func hasCondition(sb projections.Sandbox, reason string) bool {
	for _, c := range sb.Conditions {
		if c.Reason == reason {
			return true
		}
	}
	return false
}

// A log followed before anything wrote it is copied until its sandbox is
// removed, as an opened log is: rm can remove the sandbox between the
// copy's lookup and its first open.
func TestFollowingALogNotYetWrittenEndsWithItsSandbox(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	stop(f, sb)
	if err := os.Remove(f.m.Root.ConsoleLog(sb.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	followed := make(chan error, 1)
	go func() {
		followed <- f.m.Logs(f.ctx, sb.ID, LogOptions{Kind: "console", Follow: true}, &testutil.Buffer{})
	}()
	// Time for the copy to find the sandbox and no log; should the removal
	// come first on a loaded machine, the copy finds no sandbox, which ends
	// it as well.
	time.Sleep(5 * followPoll)
	if _, err := f.m.RemoveWith(f.ctx, sb.ID, RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-followed:
		if err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatalf("following a log never written: %v", err)
		}
	case <-time.After(testutil.Scale(10 * time.Second)):
		t.Fatal("following a log never written did not end when its sandbox was removed")
	}
}
