package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A daemon started by hand stops on `daemon stop` and says who asked; one
// stopped by SIGTERM says so too; `daemon stop` with no daemon is refused.
func TestDaemonStopAndWhyItStopped(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	wantFailure(t, nexus(t, root, "daemon", "stop"), 1, "no daemon serves")

	d := testutil.StartDaemon(t, nexusBin, root)
	mustOK(t, nexus(t, root, "ls"), "ls")
	out := mustOK(t, nexus(t, root, "daemon", "stop", "--json"), "daemon stop").stdout
	if want := `"pid": ` + strconv.Itoa(d.Cmd.Process.Pid); !strings.Contains(out, want) {
		t.Fatalf("daemon stop printed %q, want %s", out, want)
	}
	if code := d.Wait(t, testutil.Scale(time.Minute)); code != 0 {
		t.Fatalf("the stopped daemon exited %d", code)
	}
	if log := d.Stderr.String(); !strings.Contains(log, "asked to stop by `nexus daemon stop` (pid ") {
		t.Fatalf("the daemon's log does not say why it stopped:\n%s", log)
	}

	d = testutil.StartDaemon(t, nexusBin, root)
	if code := d.Stop(t); code != 0 {
		t.Fatalf("daemon exited %d on SIGTERM", code)
	}
	if log := d.Stderr.String(); !strings.Contains(log, "interrupted by terminated") {
		t.Fatalf("the daemon's log does not say it was stopped by SIGTERM:\n%s", log)
	}
}

// Under systemd's socket activation the daemon serves the socket it is
// passed (nexus.socket's ListenStream) and leaves it to the service manager
// when it stops; a socket bound anywhere but the root's is refused.
// systemd-socket-activate passes a socket exactly as systemd does.
func TestDaemonServesTheSocketSystemdPasses(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("systemd-socket-activate"); err != nil {
		t.Fatalf("systemd-socket-activate is not installed (make setup-test installs systemd): %v", err)
	}
	root := shortRoot(t)
	sock := filepath.Join(root, "nexus.sock")
	d := testutil.Start(t, exec.Command("systemd-socket-activate", "-l", sock, "--", nexusBin, "--state-dir", root, "daemon"))
	waitFor(t, func() bool { return exists(sock) })
	mustOK(t, nexus(t, root, "ls"), "ls through the passed socket")
	// The activator execs the daemon in its own process: the daemon that
	// answers is that process, not one the command started on demand.
	if out := mustOK(t, nexus(t, root, "daemon", "status", "--json"), "daemon status").stdout; !strings.Contains(out, `"pid": `+strconv.Itoa(d.Cmd.Process.Pid)) {
		t.Fatalf("daemon status %s: not the activated daemon (pid %d)", out, d.Cmd.Process.Pid)
	}
	mustOK(t, nexus(t, root, "daemon", "stop"), "daemon stop")
	if code := d.Wait(t, testutil.Scale(time.Minute)); code != 0 {
		t.Fatalf("the activated daemon exited %d:\n%s", code, d.Stderr.String())
	}
	if st, err := os.Lstat(sock); err != nil || st.Mode().Type() != os.ModeSocket {
		t.Fatalf("the stopped daemon removed the service manager's socket: %v", err)
	}

	elsewhere := filepath.Join(shortRoot(t), "other.sock")
	d = testutil.Start(t, exec.Command("systemd-socket-activate", "-l", elsewhere, "--", nexusBin, "--state-dir", root, "daemon"))
	// The first connection starts the daemon. The socket's file exists
	// from its bind, before the activator listens: until then a connect is
	// refused.
	waitFor(t, func() bool {
		c, err := net.Dial("unix", elsewhere)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	if code := d.Wait(t, testutil.Scale(time.Minute)); code != 1 || !strings.Contains(d.Stderr.String(), "ListenStream") {
		t.Fatalf("a daemon passed a socket at %s exited %d, want 1 naming ListenStream:\n%s", elsewhere, code, d.Stderr.String())
	}
}
