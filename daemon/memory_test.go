package daemon_test

import (
	"math"
	"os"
	"runtime/debug"
	"testing"
)

// The daemon keeps its heap near what it holds: once the journal is open
// it sets a soft memory limit (Go's default has none), restores the
// process's limit when it stops, and leaves GOMEMLIMIT's alone.
func TestDaemonSetsSoftMemoryLimit(t *testing.T) {
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 || os.Getenv("GOGC") != "" {
		t.Skipf("this process's collector is set already (limit %d, GOGC %q)", got, os.Getenv("GOGC"))
	}
	d := startDaemon(t, "")
	limit := debug.SetMemoryLimit(-1)
	if limit == math.MaxInt64 {
		t.Fatal("the daemon serves with no memory limit")
	}
	if limit < 32<<20 || limit > 1<<30 {
		t.Fatalf("memory limit %d MiB for an empty root", limit>>20)
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("after the daemon stopped the limit is %d, not the process's own", got)
	}

	t.Setenv("GOMEMLIMIT", "1GiB")
	startDaemon(t, "")
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("with GOMEMLIMIT set the daemon set a limit of %d", got)
	}
}
