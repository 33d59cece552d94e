package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// trueImage is an ext4 OS image holding the host's /bin/true and the
// libraries it loads, so that `exec -- true` runs a real program in the
// guest's OS root (the agent runs exec there when the OS disk holds an
// ext4).
func trueImage(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"bin", "lib/x86_64-linux-gnu", "lib64", "dev", "proc", "sys", "tmp", "root", "workspace"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct{ from, to string }{
		{"/bin/true", "bin/true"},
		{"/lib/x86_64-linux-gnu/libc.so.6", "lib/x86_64-linux-gnu/libc.so.6"},
		{"/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"},
	} {
		data, err := os.ReadFile(f.from) // through any link: the image holds the file
		if err != nil {
			t.Skipf("the host has no %s to put in the guest image: %v", f.from, err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.to), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(t.TempDir(), "os.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", dir, img, "64M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 -d: %v\n%s", err, out)
	}
	return img
}

// TestQEMUCreateThenExecAtOnce: on a real guest under software emulation,
// create returns once the guest agent answers, so an exec right after it
// succeeds at its first try, with no retry and no wait of its own; the
// journal says when the run booted and when it became Ready.
func TestQEMUCreateThenExecAtOnce(t *testing.T) {
	testutil.StartsSandboxes(t)
	q := newRealGuest(t, 32)
	id := strings.TrimSpace(q.ok("create", "create", "-q", "--image", trueImage(t)))
	r := q.run("exec", id, "--", "true")
	if r.code != 0 {
		t.Fatalf("exec right after create: exit %d: %s", r.code, r.stderr)
	}
	if strings.Contains(r.stderr, "waiting") {
		t.Errorf("exec right after create waited for the agent: %q", r.stderr)
	}
	sb := inspect(t, q.root, id)
	if !sb.Ready || sb.BootAt == nil || sb.ReadyAt == nil {
		t.Fatalf("after create: ready=%v boot_at=%v ready_at=%v", sb.Ready, sb.BootAt, sb.ReadyAt)
	}
	t.Logf("Ready %.1fs after boot", sb.ReadyAt.Sub(*sb.BootAt).Seconds())
	if ready, _ := readyEvents(t, q.root, id); len(ready) != 1 {
		t.Errorf("%d sandbox.ready events, want 1", len(ready))
	}
	q.finish(id)
}
