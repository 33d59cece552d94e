package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestForkResumesParentOnceCopied: a fork copies its children's disks
// concurrently and resumes the running parent as soon as the last copy is
// durable, not after the children boot. With the forker frozen right after
// the last child's last disk step, the parent's VMM already runs; then the
// fork finishes with every child running and the journal matching the disk.
func TestForkResumesParentOnceCopied(t *testing.T) {
	testutil.StartsSandboxes(t)
	const count = 4
	root := shortRoot(t)
	parent := createJSON(t, root, "--image", makeImage(t))
	p := pauseAt(t, root, "fork.workspace-disk#4", "fork", parent.ID, "--count", "4")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	info, err := vmm.NewClient(layout.Root(root).APISocket(parent.ID)).Info(ctx)
	cancel()
	if err != nil {
		p.resume(t, 0)
		t.Fatalf("parent's VMM: %v", err)
	}
	if info.State != vmm.StateRunning {
		p.resume(t, 0)
		t.Fatalf("parent is %s once every child's disks are copied, want %s (resumed before the children boot)", info.State, vmm.StateRunning)
	}
	if code := p.resume(t, 0); code != 0 {
		t.Fatalf("fork exited %d: %s", code, p.stderr.String())
	}
	if n := len(strings.Fields(p.out.String())); n != 3*count {
		t.Fatalf("fork printed %q, want %d children", p.out.String(), count)
	}
	running := 0
	for _, sb := range sandboxes(t, root) {
		if sb.State == projections.StateRunning {
			running++
		}
	}
	if running != count+1 {
		t.Fatalf("%d sandboxes running, want the parent and %d children", running, count)
	}
	journalMatchesDisk(t, root)
}
