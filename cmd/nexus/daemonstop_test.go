package main

import (
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
	if code := d.Wait(t, time.Minute); code != 0 {
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
