package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// agentInitramfs is guestInitramfs with nexus-agent as the guest's /init.
func agentInitramfs(t *testing.T, root string, g testutil.Guest) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := t.TempDir()
	agent := filepath.Join(dir, "nexus-agent")
	build := exec.Command("go", "build", "-o", agent, "./cmd/nexus-agent")
	build.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build nexus-agent: %v\n%s", err, b)
	}
	out := filepath.Join(dir, "initrd.gz")
	mustOK(t, nexus(t, root, "guest", "initramfs", "--kernel-release", g.Release, "-o", out, "--agent", agent), "guest initramfs")
	return out
}

// exec and cp on the qemu driver, with nexus-agent as the guest's PID 1: a
// file copied in lands on the guest's ext4 workspace, comes back out
// byte for byte, survives stop (whose flush the agent acknowledges) and
// start; exec passes the guest command's status and stderr through.
func TestQEMUExecAndCpThroughTheAgent(t *testing.T) {
	g := testutil.RealGuest(t)
	root := shortRoot(t)
	initrd := agentInitramfs(t, root, g)
	env := []string{"NEXUS_KERNEL_PATH=" + g.Kernel, "NEXUS_INITRAMFS_PATH=" + initrd, "NEXUS_QEMU_ACCEL=tcg"}
	qemu := func(args ...string) result {
		t.Helper()
		return nexusEnv(t, root, env, append([]string{"--driver", "qemu"}, args...)...)
	}
	id := strings.Fields(mustOK(t, qemu("create", "--image", makeImage(t)), "create").stdout)[0]
	dir := t.TempDir()
	data := make([]byte, 2<<20+3)
	rand.Read(data)
	local := filepath.Join(dir, "in.bin")
	os.WriteFile(local, data, 0o600)
	began := time.Now()
	testutil.WaitUntil(t, 90*time.Second, "the guest agent taking a file", func() bool {
		return qemu("cp", local, id+":/workspace/in.bin").code == 0
	})
	t.Logf("guest: %s; agent took the file %.1f s after create returned", g.Release, time.Since(began).Seconds())
	r := qemu("exec", id, "--", "/init", "--no-such-flag")
	if r.code != 2 || !strings.Contains(r.stderr, "no-such-flag") {
		t.Fatalf("exec in the real guest: exit %d, stderr %q; want the agent's usage error and 2", r.code, r.stderr)
	}
	back := filepath.Join(dir, "back.bin")
	mustOK(t, qemu("cp", id+":/workspace/in.bin", back), "cp out")
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatalf("cp out of the real guest: %d bytes, want the %d copied in", len(got), len(data))
	}
	r = mustOK(t, qemu("stop", id), "stop")
	if strings.Contains(r.stderr, "warning") {
		t.Fatalf("the agent's flush was not acknowledged: %s", r.stderr)
	}
	mustOK(t, qemu("start", id), "start")
	os.Remove(back)
	testutil.WaitUntil(t, 90*time.Second, "the file back after stop and start", func() bool {
		return qemu("cp", id+":/workspace/in.bin", back).code == 0
	})
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatalf("after stop and start: %d bytes, want %d", len(got), len(data))
	}
	mustOK(t, qemu("rm", "-f", id), "rm")
	if left := testutil.ProcessesUnder(root); len(left) > 0 {
		t.Errorf("rm left processes: %+v", left)
	}
}
