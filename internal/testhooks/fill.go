package testhooks

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/sagas"
)

// FillOptions shape the sandboxes Fill appends.
type FillOptions struct {
	// Sandboxes is how many to append.
	Sandboxes int
	// Batch is the most events one append (one atomic journal batch)
	// carries; 0 is the journal's largest batch.
	Batch int
	// Progress, if set, is called after each batch with the sandboxes
	// appended so far.
	Progress func(done int)
}

// FillSnapshotEvery and FillVolumeEvery say which of Fill's sandboxes hold
// a snapshot (every 10th) and have a volume of their own attached (every
// 25th).
const (
	FillSnapshotEvery = 10
	FillVolumeEvery   = 25
)

// fillDiskBytes is the apparent size of each of a filled sandbox's disk
// files; one block of each is written, the rest is a hole.
const fillDiskBytes = 1 << 20

// fillMaxBatch is the journal's largest atomic batch (a larger append is
// journaled one event at a time), and fillMostPerSandbox the most events
// one filled sandbox appends.
const (
	fillMaxBatch       = 1000
	fillMostPerSandbox = 16
)

// collector is a saga journal that keeps what a saga appends, so that the
// sagas of many sandboxes reach the real journal in a few large appends.
type collector struct{ evs []events.Event }

func (c *collector) Append(_ context.Context, evs ...events.Event) ([]uint64, error) {
	c.evs = append(c.evs, evs...)
	return make([]uint64, len(evs)), nil
}

// Fill appends opt.Sandboxes stopped sandboxes to j, as a long-used root
// holds them: each one's create saga, run by the saga runner (its intent,
// its OS and workspace disks, its record directory, its handle), then a
// stop; every FillSnapshotEvery-th takes a snapshot of its two disks, and
// every FillVolumeEvery-th has a volume created and attached. Every file
// the events name exists under root, small and sparse. Events go to j
// opt.Batch at a time, so the store's group commit takes them in a few
// large commits. It returns the IDs in the order appended.
func Fill(ctx context.Context, j sagas.Journal, root string, opt FillOptions) ([]string, error) {
	if opt.Batch <= 0 || opt.Batch > fillMaxBatch {
		opt.Batch = fillMaxBatch
	}
	block := make([]byte, 4096)
	for i := range block {
		block[i] = byte(i)
	}
	sparse := func(rel string) error {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = f.Write(block)
		if err == nil {
			err = f.Truncate(fillDiskBytes)
		}
		return errors.Join(err, f.Close())
	}
	mkdir := func(rel string) error { return os.MkdirAll(filepath.Join(root, rel), 0o755) }
	var (
		c    collector
		ids  []string
		done int
	)
	flush := func() error {
		if len(c.evs) == 0 {
			return nil
		}
		if _, err := j.Append(ctx, c.evs...); err != nil {
			return err
		}
		c.evs = c.evs[:0]
		if opt.Progress != nil {
			opt.Progress(done)
		}
		return nil
	}
	for n := range opt.Sandboxes {
		id := ulid.Make().String()
		handle := "fill-" + strings.ToLower(id[len(id)-10:])
		res := func(kind events.ResourceKind, rel string) events.Resource {
			return events.Resource{Kind: kind, Path: rel}
		}
		intent := res(events.KindCreateIntent, "disks/"+id+".create-intent.json")
		osDisk := res(events.KindRawDisk, "disks/"+id+".raw")
		work := res(events.KindWorkspaceDisk, "disks/"+id+"-workspace.ext4")
		record := res(events.KindRecord, "sandboxes/"+id)
		disk := func(r events.Resource) func(context.Context) ([]events.Payload, error) {
			return func(context.Context) ([]events.Payload, error) {
				if err := sparse(r.Path); err != nil {
					return nil, err
				}
				return sagas.One(events.DiskMaterialisedEvent{Resource: r, Method: "sparse-copy", AllocatedBytes: int64(len(block)), ApparentBytes: fillDiskBytes}), nil
			}
		}
		emit := func(p ...events.Payload) func(context.Context) ([]events.Payload, error) {
			return func(context.Context) ([]events.Payload, error) { return p, nil }
		}
		created := events.SandboxCreatedEvent{Handle: handle, Image: "fill.raw", Driver: "process", Resources: []events.Resource{osDisk, work, record}}
		steps := []sagas.Step{
			{Name: "intents", Do: emit(events.IntentWrittenEvent{Resource: intent, Covers: []string{osDisk.Path, work.Path, record.Path}})},
			{Name: "os-disk", Do: disk(osDisk)},
			{Name: "workspace-disk", Do: disk(work)},
			{Name: "record-dir", Do: func(context.Context) ([]events.Payload, error) {
				return sagas.One(events.ResourceCreatedEvent{Resource: record}), mkdir(record.Path)
			}},
			{Name: "commit", Pivot: true, Do: emit(created, events.HandleClaimedEvent{Sandbox: id, Handle: handle})},
			{Name: "retire-intents", Do: emit(events.IntentRetiredEvent{Resource: intent})},
		}
		if n%FillVolumeEvery == 0 {
			name := "fill-" + strings.ToLower(id[len(id)-10:])
			vol := "volumes/" + name + "/disk.ext4"
			steps = append(steps, sagas.Step{Name: "volume", Do: func(context.Context) ([]events.Payload, error) {
				if err := sparse(vol); err != nil {
					return nil, err
				}
				return []events.Payload{events.VolumeCreatedEvent{Name: name, Path: vol, SizeBytes: fillDiskBytes}, events.VolumeAttachedEvent{Name: name, GuestPath: "/data"}}, nil
			}})
		}
		steps = append(steps, sagas.Step{Name: "stop", Do: emit(events.SandboxStoppedEvent{Reason: "stopped"})})
		create := &sagas.Saga{Kind: events.SagaCreate, Sandbox: id, Steps: steps}
		if err := create.Run(ctx, &c); err != nil {
			return ids, fmt.Errorf("fill sandbox %s: %w", id, err)
		}
		if n%FillSnapshotEvery == 0 {
			snap := ulid.Make().String()
			dir := res(events.KindSnapshot, "snapshots/"+id+"/"+snap)
			take := &sagas.Saga{Kind: events.SagaSnapshot, Sandbox: id, Steps: []sagas.Step{{Name: "capture", Do: func(context.Context) ([]events.Payload, error) {
				for _, name := range []string{id + ".raw", id + "-workspace.ext4"} {
					if err := sparse(dir.Path + "/" + name); err != nil {
						return nil, err
					}
				}
				return []events.Payload{events.ResourceCreatedEvent{Resource: res(events.KindSnapshot, "snapshots/"+id)}, events.SnapshotTakenEvent{SnapshotID: snap, Dir: dir, AllocatedBytes: 2 * int64(len(block))}}, nil
			}}}}
			if err := take.Run(ctx, &c); err != nil {
				return ids, fmt.Errorf("fill snapshot of %s: %w", id, err)
			}
		}
		ids = append(ids, id)
		done++
		if len(c.evs)+fillMostPerSandbox > opt.Batch {
			if err := flush(); err != nil {
				return ids, err
			}
		}
	}
	return ids, flush()
}
