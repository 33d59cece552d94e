package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// fork of a running parent freezes the guest's filesystems through its
// agent before the copies and thaws them once the copies are durable,
// before the child boots: a fork killed just before its child's commit
// leaves the parent running and thawed, without recover.
func TestForkFreezesAndThawsBeforeTheChildBoots(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	parent := createJSON(t, root, "--image", makeImage(t))
	crashAt(t, root, "fork.commit:before", "fork", parent.ID)
	console, _ := os.ReadFile(filepath.Join(root, "logs", parent.ID+".console.log"))
	froze, thawed := strings.Index(string(console), "froze"), strings.Index(string(console), "thawed")
	if froze < 0 || thawed < froze {
		t.Fatalf("the parent's console shows no freeze then thaw before the child's commit:\n%s", console)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if info, err := vmm.NewClient(filepath.Join(root, "run", "sb-"+parent.ID+".sock")).Info(ctx); err != nil || info.State != vmm.StateRunning {
		t.Fatalf("parent VM after its fork's copies: %+v %v, want running (resumed before the child boots)", info.State, err)
	}
	recoverClean(t, root)

	// A full fork: one freeze and one thaw more.
	child := mustOK(t, proc(t, root, "fork", parent.ID), "fork")
	if strings.Contains(child.stderr, "warning") {
		t.Errorf("a frozen fork warned: %q", child.stderr)
	}
	console, _ = os.ReadFile(filepath.Join(root, "logs", parent.ID+".console.log"))
	if n := strings.Count(string(console), "thawed"); n != 2 {
		t.Errorf("%d thaws after two forks:\n%s", n, console)
	}
}

// Without an agent to freeze it, a running sandbox is neither forked nor
// snapshotted, unless --crash-consistent says to copy it as a power cut
// would leave it, and then nexus says so.
func TestForkAndSnapshotRefuseWithoutAFreeze(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	os.Remove(filepath.Join(root, "run", "sb-"+sb.ID+".vsock"))
	wantFailure(t, proc(t, root, "fork", "--freeze-timeout", "2s", sb.ID), 1, "did not freeze its filesystems")
	wantFailure(t, proc(t, root, "snapshot", sb.ID), 1, "--crash-consistent")
	if n := len(sandboxes(t, root)); n != 1 {
		t.Fatalf("a refused fork left %d sandboxes", n)
	}
	if got := sandboxes(t, root)[0]; got.State != "running" || len(got.Snapshots) != 0 {
		t.Fatalf("after the refusals: %s with %d snapshots, want running with none", got.State, len(got.Snapshots))
	}
	r := mustOK(t, proc(t, root, "fork", "--crash-consistent", sb.ID), "fork --crash-consistent")
	if !strings.Contains(r.stderr, "nexus: warning: fork of running sandbox "+sb.ID+" is crash-consistent only") {
		t.Errorf("fork --crash-consistent did not say so: %q", r.stderr)
	}
	r = mustOK(t, proc(t, root, "snapshot", "--crash-consistent", sb.ID), "snapshot --crash-consistent")
	if !strings.Contains(r.stderr, "crash-consistent only") {
		t.Errorf("snapshot --crash-consistent did not say so: %q", r.stderr)
	}
	if n := len(sandboxes(t, root)); n != 2 {
		t.Errorf("%d sandboxes after one crash-consistent fork", n)
	}
}

// snapshot of a running sandbox freezes it for the copies and thaws it
// after; its memory was saved frozen, so restore thaws the restored guest.
func TestSnapshotFreezesAndRestoreThaws(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	console, _ := os.ReadFile(filepath.Join(root, "logs", sb.ID+".console.log"))
	if froze, thawed := strings.Index(string(console), "froze"), strings.Index(string(console), "thawed"); froze < 0 || thawed < froze {
		t.Fatalf("the snapshot did not freeze then thaw the guest:\n%s", console)
	}
	man, _ := os.ReadFile(filepath.Join(root, "snapshots", sb.ID, snap, "manifest.json"))
	if !strings.Contains(string(man), `"frozen": true`) {
		t.Fatalf("manifest does not say the memory was saved frozen:\n%s", man)
	}
	child := createdID(t, mustOK(t, proc(t, root, "restore", "--json", snap), "restore").stdout)
	console, _ = os.ReadFile(filepath.Join(root, "logs", child+".console.log"))
	if !strings.Contains(string(console), "thawed") {
		t.Fatalf("the restored guest was not thawed:\n%s", console)
	}
}

func createdID(t *testing.T, out string) string {
	t.Helper()
	var sb jsonSandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.ID == "" {
		t.Fatalf("restore --json: %v\n%s", err, out)
	}
	return sb.ID
}
