package client_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/client"
)

// daemonPids lists the `nexus daemon` processes serving root.
func daemonPids(root string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		i := slices.Index(args, "--state-dir")
		if i >= 0 && i+2 < len(args) && args[i+1] == root && args[i+2] == "daemon" {
			out = append(out, pid)
		}
	}
	return out
}

// stopDaemons stops the daemon the nexus commands started on demand for
// root (SIGTERM, SIGKILL after a minute), so it does not outlive the test.
func stopDaemons(root string) {
	for _, pid := range daemonPids(root) {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	for deadline := time.Now().Add(time.Minute); len(daemonPids(root)) > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	for _, pid := range daemonPids(root) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// TestCreateFromTwoGoroutines: one client, two goroutines creating at once
// on a root where nobody started a daemon; every create succeeds and Close
// removes them all.
func TestCreateFromTwoGoroutines(t *testing.T) {
	root := shortRoot(t)
	c, err := client.New(client.Options{Nexus: nexusBin, StateDir: root, Driver: "process"})
	if err != nil {
		t.Fatal(err)
	}
	img := image(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	ids := make(chan string, 6)
	for range 2 {
		wg.Go(func() {
			for range 3 {
				sb, err := c.Create(ctx, client.CreateSpec{Image: img})
				errs <- err
				ids <- sb.ID
			}
		})
	}
	wg.Wait()
	close(errs)
	close(ids)
	for err := range errs {
		if err != nil {
			t.Fatalf("create: %v", err)
		}
	}
	live := liveIDs(t, root)
	for id := range ids {
		if !live[id] {
			t.Fatalf("created %s is not listed", id)
		}
	}
	if len(live) != 6 {
		t.Fatalf("%d sandboxes live, want 6", len(live))
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(liveIDs(t, root)); n != 0 {
		t.Fatalf("%d sandboxes left after Close", n)
	}
}
