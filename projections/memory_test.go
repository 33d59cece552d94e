package projections_test

import (
	"math/rand"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

const (
	memSandboxes   = 100_000
	memPerSandbox  = 4         // raw disk, workspace disk, API socket, supervisor state dir
	memBudgetBytes = 200 << 20 // 200 MiB
)

// TestOwnershipMemory100k folds the lifecycle of 100,000 live sandboxes, each
// owning four resources, into one Sandboxes view held whole in memory (the
// ownership index a store falls back on without its bbolt file) and checks
// what the view keeps on the heap stays under 200 MiB.
//
// Events are generated and applied one at a time, so only the view is live
// at the second measurement. Every event builds its own path strings, as
// events.Decode does when the store replays the journal: when disk.materialised
// and sandbox.created both name a disk, the view holds whatever copies it
// keeps, as it would after a real replay.
func TestOwnershipMemory100k(t *testing.T) {
	if testing.Short() {
		t.Skip("folds 100,000 sandboxes; make test runs it, -short does not")
	}
	entropy := ulid.Monotonic(rand.New(rand.NewSource(3)), 0)
	t0 := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

	before := heapAfterGC()
	start := time.Now()
	o := projections.NewSandboxes()
	seq := uint64(0)
	apply := func(at time.Time, sb string, p events.Payload) {
		seq++
		o.Apply(seq, events.New(ulid.MustNew(ulid.Timestamp(at), entropy), at, sb, p))
	}
	for i := 0; i < memSandboxes; i++ {
		at := t0.Add(time.Duration(i) * time.Second)
		sb := ulid.MustNew(ulid.Timestamp(at), entropy).String()
		apply(at, sb, events.DiskMaterialisedEvent{
			Resource: events.Resource{Kind: events.KindRawDisk, Path: "disks/" + sb + ".raw"},
			Method:   "reflink", AllocatedBytes: 1 << 20, ApparentBytes: 8 << 30})
		apply(at, sb, events.DiskMaterialisedEvent{
			Resource: events.Resource{Kind: events.KindWorkspaceDisk, Path: "disks/" + sb + "-workspace.ext4"},
			Method:   "mkfs", AllocatedBytes: 64 << 20, ApparentBytes: 4 << 30})
		apply(at, sb, events.SandboxCreatedEvent{Handle: "sb-" + strconv.Itoa(i), Image: "ghcr.io/nexus/base:24.04", Driver: "firecracker",
			Resources: []events.Resource{
				{Kind: events.KindRawDisk, Path: "disks/" + sb + ".raw"},
				{Kind: events.KindWorkspaceDisk, Path: "disks/" + sb + "-workspace.ext4"},
			}})
		apply(at, sb, events.SandboxStartedEvent{Driver: "firecracker", VMMPid: 1000 + i, VMMStart: uint64(i),
			Sockets: []events.Resource{{Kind: events.KindAPISocket, Path: "run/sb-" + sb + ".sock"}}})
		apply(at, sb, events.SupervisorStartedEvent{Pid: 2000 + i, Start: uint64(i), Socket: "run/sup-" + sb + ".sock",
			StateDir: events.Resource{Kind: events.KindSupervisorState, Path: "supervisors/" + sb}})
	}
	folded := time.Since(start)
	after := heapAfterGC()

	if got := o.Len(); got != memSandboxes {
		t.Fatalf("the view holds %d sandboxes, want %d", got, memSandboxes)
	}
	if id, ok := o.PathOwner("supervisors/" + o.List()[0].ID); !ok || id != o.List()[0].ID {
		t.Fatalf("the first sandbox's supervisor state is owned by %q, %v", id, ok)
	}
	inuse := int64(after.HeapInuse) - int64(before.HeapInuse)
	alloc := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("sandboxes view of %d sandboxes (%d paths each, %d events folded in %v): heap in use +%.1f MiB, live objects +%.1f MiB (%.0f B/sandbox), budget %d MiB",
		memSandboxes, memPerSandbox, seq, folded.Round(time.Millisecond),
		float64(inuse)/(1<<20), float64(alloc)/(1<<20), float64(alloc)/memSandboxes, memBudgetBytes>>20)
	if inuse > memBudgetBytes {
		t.Errorf("the sandboxes view of %d sandboxes uses %.1f MiB of heap, budget %d MiB", memSandboxes, float64(inuse)/(1<<20), memBudgetBytes>>20)
	}
	runtime.KeepAlive(o)
}

func heapAfterGC() runtime.MemStats {
	runtime.GC()
	runtime.GC() // a second cycle frees what the first one's finalizers released
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}
