package lifecycle

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/sagalease"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// ForkSpec is what `nexus fork` asks for.
type ForkSpec struct {
	Parent string
	Count  int
	// Handle names the children: a template whose {n} is each child's
	// number, 1..Count (ChildHandles); without {n} it names one child.
	Handle string
	// Labels are every child's labels; a child does not inherit its
	// parent's.
	Labels events.Labels
	Force  bool
	// ReadOnlyVolumes attaches the parent's named volumes to every child
	// read-only. Without it a parent with volumes is refused: a writable
	// volume is never shared between sandboxes.
	ReadOnlyVolumes bool
	// CrashConsistent forks a running parent whose guest agent does not
	// freeze its filesystems anyway (see quiesce).
	CrashConsistent bool
}

// sourceDisk is one disk a child copies, and where the copy goes.
type sourceDisk struct {
	kind events.ResourceKind
	src  string // absolute
	dst  string // absolute
	name string // step name
}

// MaxForkChildren bounds one fork's --count.
const MaxForkChildren = 256

// CheckForkCount refuses a child count outside 1..MaxForkChildren; the CLI
// calls it before anything opens so a bad count is a usage error.
func CheckForkCount(n int) error {
	if n < 1 || n > MaxForkChildren {
		return fmt.Errorf("%w: --count %d: want 1..%d", ErrRefused, n, MaxForkChildren)
	}
	return nil
}

// HandleNumber is what a fork's --handle template holds where each
// child's number goes.
const HandleNumber = "{n}"

// ChildHandles are the handles of a fork's count children from template:
// {n} replaced by 1..count ("web/{n}" gives web/1, web/2, ...). A template
// without {n} names one child, so it is refused with a count above 1. No
// template, no handles ("" each).
func ChildHandles(template string, count int) ([]string, error) {
	out := make([]string, count)
	if template == "" {
		return out, nil
	}
	if !strings.Contains(template, HandleNumber) && count != 1 {
		return nil, fmt.Errorf("%w: --handle %q names one child: with --count %d it needs %s, the child's number (e.g. web/%s)", ErrRefused, template, count, HandleNumber, HandleNumber)
	}
	for i := range out {
		out[i] = strings.ReplaceAll(template, HandleNumber, strconv.Itoa(i+1))
	}
	return out, nil
}

// Fork creates Count children of a committed sandbox, each a full set of
// copy-on-write disks owned by the child, one saga per child.
func (m *Manager) Fork(ctx context.Context, spec ForkSpec) ([]projections.Sandbox, error) {
	c, err := m.claim(ctx, spec.Parent, core.Fork)
	if err != nil {
		return nil, err
	}
	defer c.release()
	parent := c.sb
	if err := CheckForkCount(spec.Count); err != nil {
		return nil, err
	}
	handles, err := ChildHandles(spec.Handle, spec.Count)
	if err != nil {
		return nil, err
	}
	// Every child's handle is decided before anything is copied: a fork
	// one of whose handles is taken makes no child.
	handleExpects := make([][]core.Expect, spec.Count)
	for i, h := range handles {
		if handleExpects[i], err = m.decideHandle(ctx, h); err != nil {
			return nil, err
		}
	}
	if len(parent.Volumes) > 0 && !spec.ReadOnlyVolumes {
		names := make([]string, len(parent.Volumes))
		for i, v := range parent.Volumes {
			names[i] = v.Name
		}
		return nil, fmt.Errorf("%w: sandbox %s has named volume(s) %s attached; children would share a writable volume (pass --readonly-volumes to attach them read-only to the children)", ErrRefused, parent.ID, strings.Join(names, ", "))
	}
	if err := refuseLockedVolumes(parent); err != nil {
		return nil, err
	}
	if err := m.bootable(core.Fork, parent); err != nil {
		return nil, err
	}
	sources := m.parentDisks(parent)
	if err := m.preflightCopies(sources, spec.Count, 0, spec.Force); err != nil {
		return nil, err
	}
	release, _, err := m.quiesce(ctx, parent, "fork", spec.CrashConsistent)
	if err != nil {
		return nil, err
	}
	// Frozen and paused until every child's copies are durable.
	resume := sync.OnceFunc(release)
	defer resume()
	var mounts []Mount
	for _, v := range parent.Volumes {
		mounts = append(mounts, Mount{Name: v.Name, GuestPath: v.GuestPath})
	}
	boot, err := m.bootstrapOf(ctx, parent.ID)
	if err != nil {
		return nil, err
	}
	// Children are copied forkCopiers at a time, each in its own saga; a
	// slot is freed as soon as that child's copies are durable, so its
	// boot overlaps the next child's copies, and the parent resumes once
	// every child's copies are durable, before the children boot. Children
	// that attach the parent's volumes go one at a time: attaching takes
	// each volume's lease.
	parallel := forkCopiers
	if len(mounts) > 0 {
		parallel = 1
	}
	slots := make(chan struct{}, parallel)
	var copying atomic.Int64
	copying.Store(int64(spec.Count))
	ids := make([]string, spec.Count)
	errs := make([]error, spec.Count)
	started := make([]bool, spec.Count)
	var failed atomic.Bool
	var running sync.WaitGroup
	for i := range ids {
		ids[i] = ulid.Make().String()
		// The last child to finish copying resumes the parent itself, in
		// its last disk step, before that step's event is journaled.
		copied := sync.OnceFunc(func() {
			<-slots
			if copying.Add(-1) == 0 {
				resume()
			}
		})
		slots <- struct{}{}
		if failed.Load() || ctx.Err() != nil {
			// Stop starting children once one failed or the fork was
			// interrupted; those not started count as copied.
			copied()
			continue
		}
		started[i] = true
		running.Add(1)
		go func() {
			defer running.Done()
			defer copied()
			child := ids[i]
			copies := m.childCopies(parent, child, sources)
			committed := func(rs []events.Resource) events.Payload {
				return events.SandboxForkedEvent{Parent: parent.ID, Handle: handles[i], Image: parent.Image, Driver: parent.Driver, Resources: rs, Bootstrap: boot, Boot: parent.BootConfig, Labels: spec.Labels}
			}
			if errs[i] = m.runChild(ctx, events.SagaFork, child, parent.ID, copies, committed, mounts, true, "", nil, copied, handleExpects[i]); errs[i] != nil {
				failed.Store(true)
			}
		}()
	}
	running.Wait()
	// Every child that exists is reported, with the first failure: one
	// interrupted after its commit is kept (a commit is never undone).
	var children []projections.Sandbox
	var first error
	for i, child := range ids {
		if !started[i] {
			continue
		}
		first = cmp.Or(first, errs[i])
		sb, err := m.Find(context.WithoutCancel(ctx), child)
		if err != nil {
			if errs[i] == nil {
				first = cmp.Or(first, err)
			}
			continue
		}
		children = append(children, sb)
	}
	return children, first
}

// forkCopiers is how many children of one fork copy their disks at once:
// enough to keep a virtio or NVMe queue busy while one copy waits on its
// fsync, few enough that a 2-core host still has CPU for the zero scan.
const forkCopiers = 3

// refuseLockedVolumes refuses, before anything is copied, a fork whose
// children would attach a volume the running parent's VMM holds
// read-write: Cloud Hypervisor (v46+) takes an OFD write lock on such a
// disk, so a child's VMM cannot open it even read-only and its boot would
// fail.
func refuseLockedVolumes(parent projections.Sandbox) error {
	if parent.State != projections.StateRunning {
		return nil
	}
	var held []string
	for _, v := range parent.Volumes {
		if !v.ReadOnly {
			held = append(held, v.Name)
		}
	}
	if len(held) == 0 {
		return nil
	}
	return fmt.Errorf("%w: sandbox %s is running and its VMM holds volume(s) %s read-write, locked, so a child cannot open them even read-only; stop %s and fork it stopped", ErrRefused, parent.ID, strings.Join(held, ", "), parent.ID)
}

// parentDisks lists the disks of sb a child copies: OS, workspace, shadows.
func (m *Manager) parentDisks(sb projections.Sandbox) []sourceDisk {
	var out []sourceDisk
	for _, r := range sb.Resources {
		switch r.Kind {
		case events.KindRawDisk, events.KindWorkspaceDisk, events.KindShadowDisk:
			out = append(out, sourceDisk{kind: r.Kind, src: m.Root.Abs(r.Path)})
		}
	}
	return out
}

// childCopies names each copy after the child: <child>.raw,
// <child>-workspace.ext4, <child>-<parentSafeHandle>.shadow.<name>.ext4.
func (m *Manager) childCopies(parent projections.Sandbox, child string, sources []sourceDisk) []sourceDisk {
	out := make([]sourceDisk, 0, len(sources))
	for _, s := range sources {
		c := s
		switch s.kind {
		case events.KindRawDisk:
			c.dst, c.name = m.Root.RawDisk(child), "os-disk"
		case events.KindWorkspaceDisk:
			c.dst, c.name = m.Root.WorkspaceDisk(child), "workspace-disk"
		case events.KindShadowDisk:
			name, _ := layout.ShadowName(s.src)
			handle := parent.Handle
			if handle == "" {
				handle = parent.ID
			}
			c.dst, c.name = m.Root.ForkShadowDisk(child, handle, name), "shadow."+name
		}
		out = append(out, c)
	}
	return out
}

// preflightCopies checks that count copies of sources, plus extra bytes
// once, fit on the disks directory's filesystem.
func (m *Manager) preflightCopies(sources []sourceDisk, count int, extra int64, force bool) error {
	if err := m.ensureDirs("disks", "run", "supervisors", "sandboxes", "logs", "snapshots"); err != nil {
		return err
	}
	// A copy is a FICLONE where the filesystem reflinks and the source is
	// on it: no data blocks (as for a create's OS disk, osDiskCost).
	cow := disk.Reflinks(m.Root.Disks())
	var footprint int64
	for _, s := range sources {
		size, err := disk.Stat(s.src)
		if err != nil {
			return fmt.Errorf("%w: measure %s: %v", ErrRefused, s.src, err)
		}
		if !cow || !disk.SameFilesystem(s.src, m.Root.Disks()) {
			footprint += size.Allocated
		}
	}
	if force {
		return nil
	}
	if err := disk.Preflight(m.Root.Disks(), footprint*int64(count)+extra); err != nil {
		return fmt.Errorf("%w: %d x %d + %d bytes: %v (--force skips this check)", ErrRefused, count, footprint, extra, err)
	}
	return nil
}

// pauseIfRunning pauses a running sandbox's VM so its disks are copied at
// one instant; the returned func resumes it. recover resumes a VM a
// crashed fork left paused.
func (m *Manager) pauseIfRunning(ctx context.Context, sb projections.Sandbox) (func(), error) {
	if sb.State != projections.StateRunning {
		return func() {}, nil
	}
	c := vmm.NewClient(m.Root.APISocket(sb.ID))
	if err := c.Pause(ctx); err != nil {
		return nil, fmt.Errorf("pause %s: %w", sb.ID, err)
	}
	return func() { c.Resume(context.WithoutCancel(ctx)) }, nil
}

// runChild runs the create-like saga of a fork or restore child.
func (m *Manager) runChild(ctx context.Context, kind events.SagaKind, child, seedCA string, copies []sourceDisk,
	committed func([]events.Resource) events.Payload, mounts []Mount, readOnly bool, restoreFrom string, stage *sagas.Step, copied func(), handle []core.Expect) error {
	s := m.saga(kind, child, nil)
	hold, expect, err := m.holdNew(ctx, kind, child, mounts, readOnly)
	if err != nil {
		return err
	}
	defer hold.release()
	s.Expect = append(expect, handle...)
	m.decided(kind)
	covers := []string{m.rel(m.Root.SupervisorDir(child)), m.rel(filepath.Dir(m.Root.Record(child))), m.rel(m.Root.SnapshotsOf(child))}
	for _, c := range copies {
		covers = append(covers, m.rel(c.dst))
	}
	held, intents, err := m.publishIntents(hold, child, s.ID, "", covers)
	if err != nil {
		return err
	}
	defer releaseAll(held)
	m.published(kind)
	var journaled bool
	s.Steps = append(s.Steps, m.intentsStep(held, intents, &journaled))
	for i, c := range copies {
		st := m.diskStep(c.name, m.res(c.kind, c.dst), func(dst string) (disk.Method, error) {
			return m.clone(c.name+" of "+child, c.src, dst)
		})
		if i == len(copies)-1 && copied != nil {
			// Clone fsyncs before it returns: the last copy is durable, and
			// the source is no longer read.
			do := st.Do
			st.Do = func(ctx context.Context) ([]events.Payload, error) {
				ps, err := do(ctx)
				if err == nil {
					copied()
				}
				return ps, err
			}
		}
		s.Steps = append(s.Steps, st)
	}
	if stage != nil {
		s.Steps = append(s.Steps, *stage)
	}
	s.Steps = append(s.Steps, m.supervisorStateStep(child, seedCA), m.recordDirStep(child))
	s.Steps = append(s.Steps, m.commitStep(child, committed), m.retireStep(held, intents))
	s.Steps = append(s.Steps, m.attachSteps(mounts, readOnly)...)
	s.Steps = append(s.Steps, m.bootSteps(child, restoreFrom)...)
	if err := s.Run(ctx, m.B); err != nil {
		if !journaled {
			dropIntents(m, hold, held, intents)
		}
		if len(handle) > 0 {
			err = m.handleTaken(ctx, handle[0].Entity.Name(), child, err)
		}
		return err
	}
	_, err = m.writeRecord(ctx, child)
	return err
}

// manifest describes a snapshot directory.
type manifest struct {
	Sandbox string `json:"sandbox"`
	Image   string `json:"image"`
	Handle  string `json:"handle,omitempty"`
	VMState bool   `json:"vm_state"`
	// Frozen: the guest's filesystems were frozen by its agent when its
	// memory was saved, so a restored guest wakes frozen until thawed.
	Frozen bool           `json:"frozen,omitempty"`
	Disks  []manifestDisk `json:"disks"`
	// Bootstrap is the image cache entry the sandbox came from, carried to
	// a restored sandbox so it protects that entry only.
	Bootstrap events.Bootstrap `json:"bootstrap,omitzero"`
}

type manifestDisk struct {
	Kind events.ResourceKind `json:"kind"`
	File string              `json:"file"`
}

// Snapshot captures a sandbox into snapshots/<id>/<snapshot>/, a path the
// reaper attributes to the owning sandbox: its disks, and the VM state
// when it runs.
func (m *Manager) Snapshot(ctx context.Context, ref string) (string, error) {
	return m.SnapshotWith(ctx, ref, SnapshotOptions{})
}

// SnapshotOptions are `nexus snapshot`'s choices.
type SnapshotOptions struct {
	// CrashConsistent snapshots a running sandbox whose guest agent does
	// not freeze its filesystems anyway (see quiesce).
	CrashConsistent bool
}

// SnapshotWith is Snapshot with options.
func (m *Manager) SnapshotWith(ctx context.Context, ref string, opt SnapshotOptions) (string, error) {
	c, err := m.claim(ctx, ref, core.Snapshot)
	if err != nil {
		return "", err
	}
	defer c.release()
	sb := c.sb
	snap := ulid.Make().String()
	dir := m.Root.Snapshot(sb.ID, snap)
	r := m.res(events.KindSnapshot, dir)
	sources := m.parentDisks(sb)
	// A running guest's snapshot also writes its memory (memory-ranges),
	// as large as its RAM.
	var memory int64
	if sb.State == projections.StateRunning {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := vmm.NewClient(m.Root.APISocket(sb.ID)).Info(ictx)
		cancel()
		if err != nil {
			return "", fmt.Errorf("snapshot %s: guest memory size: %w", sb.ID, err)
		}
		memory = info.Config.Memory.Size
	}
	if err := m.preflightCopies(sources, 1, memory, false); err != nil {
		return "", err
	}
	made := false // undo removes only a directory this capture made
	step := sagas.Step{
		Name: "capture",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			if err := fsx.MkdirAll(string(m.Root), m.Root.SnapshotsOf(sb.ID), 0o700); err != nil {
				return nil, err
			}
			if err := fsx.Mkdir(string(m.Root), dir, 0o700); err != nil {
				return nil, err
			}
			made = true
			release, frozen, err := m.quiesce(ctx, sb, "snapshot", opt.CrashConsistent)
			if err != nil {
				return nil, err
			}
			defer release()
			boot, err := m.bootstrapOf(ctx, sb.ID)
			if err != nil {
				return nil, err
			}
			man := manifest{Sandbox: sb.ID, Image: sb.Image, Handle: sb.Handle, VMState: sb.State == projections.StateRunning, Frozen: frozen, Bootstrap: boot}
			var allocated int64
			if man.VMState {
				if err := vmm.NewClient(m.Root.APISocket(sb.ID)).Snapshot(ctx, dir); err != nil {
					return nil, err
				}
				files, err := vmStateFiles(dir, man)
				if err != nil {
					return nil, err
				}
				allocated += filesAllocated(dir, files)
			}
			for _, s := range sources {
				file := filepath.Base(s.src)
				if _, err := m.clone("snapshot of "+file, s.src, filepath.Join(dir, file)); err != nil {
					return nil, err
				}
				size, _ := disk.Stat(filepath.Join(dir, file))
				allocated += size.Allocated
				man.Disks = append(man.Disks, manifestDisk{Kind: s.kind, File: file})
			}
			release() // the copies are durable: the guest goes on
			data, _ := json.MarshalIndent(man, "", "  ")
			if err := fsx.WriteFile(string(m.Root), filepath.Join(dir, "manifest.json"), data, 0o600); err != nil {
				return nil, err
			}
			// The VMM's files are not synced by the VMM (CH never syncs
			// them): a snapshot is journaled only once all of it, and its
			// entry in the sandbox's snapshots directory, are durable.
			if err := durable.SyncDirFiles(dir); err != nil {
				return nil, fmt.Errorf("snapshot %s: %w", snap, err)
			}
			ps := []events.Payload{events.SnapshotTakenEvent{SnapshotID: snap, Dir: r, AllocatedBytes: allocated}}
			if parent := m.res(events.KindSnapshot, m.Root.SnapshotsOf(sb.ID)); !sb.Owns(parent.Path) {
				ps = append([]events.Payload{events.ResourceCreatedEvent{Resource: parent}}, ps...)
			}
			return ps, nil
		},
		Undo: func(context.Context) ([]events.Payload, error) {
			if !made {
				return nil, nil
			}
			ps, err := m.reclaim(r, false, "compensation")
			if err != nil {
				return ps, err
			}
			more, err := m.dropEmptySnapshotsDir(sb, "compensation")
			return append(ps, more...), err
		},
	}
	s := m.saga(events.SagaSnapshot, sb.ID, []sagas.Step{step})
	s.Expect = c.expect()
	c.lease.Set(sagalease.Holder{Kind: string(s.Kind), Saga: s.ID})
	if err := s.Run(ctx, m.B); err != nil {
		return "", err
	}
	return snap, nil
}

// RestoreOptions are `nexus restore`'s choices.
type RestoreOptions struct {
	Force  bool          // skip the disk-space preflight
	Handle string        // names the new sandbox
	Labels events.Labels // the new sandbox's labels
}

// Restore creates a new sandbox from a snapshot, through the fork path.
func (m *Manager) Restore(ctx context.Context, snap string, o RestoreOptions) (projections.Sandbox, error) {
	force := o.Force
	snap, src, err := m.findSnapshot(ctx, snap)
	if err != nil {
		return projections.Sandbox{}, err
	}
	source := &src
	// The source is held for the restore: rm of it (which deletes its
	// snapshots) waits or is refused until the copies are made.
	c, err := m.claim(ctx, source.ID, core.Restore)
	if err != nil {
		return projections.Sandbox{}, err
	}
	defer c.release()
	source = &c.sb
	if !hasSnapshot(c.sb, snap) {
		return projections.Sandbox{}, fmt.Errorf("%w: no snapshot %q (removed meanwhile)", ErrNotFound, snap)
	}
	// The child boots as the snapshotted sandbox does: its VM state, if
	// any, was made by that driver at that size.
	if err := m.bootable(core.Restore, *source); err != nil {
		return projections.Sandbox{}, err
	}
	dir := m.Root.Snapshot(source.ID, strings.ToUpper(snap))
	data, err := fsx.ReadFile(string(m.Root), filepath.Join(dir, "manifest.json"))
	if err != nil {
		return projections.Sandbox{}, fmt.Errorf("snapshot %s: %w", snap, err)
	}
	var man manifest
	if err := json.Unmarshal(data, &man); err != nil {
		return projections.Sandbox{}, fmt.Errorf("snapshot %s: manifest: %w", snap, err)
	}
	child := ulid.Make().String()
	var sources []sourceDisk
	for _, d := range man.Disks {
		if strings.ContainsRune(d.File, '/') || d.File == ".." {
			return projections.Sandbox{}, fmt.Errorf("snapshot %s: manifest names %q outside the snapshot", snap, d.File)
		}
		sources = append(sources, sourceDisk{kind: d.Kind, src: filepath.Join(dir, d.File)})
	}
	copies := m.childCopies(*source, child, sources)
	// A running sandbox's snapshot: every file the VMM wrote is staged for
	// the child, and counted in the preflight.
	var stateFiles []string
	var edit vmm.SnapshotEdit
	if man.VMState {
		if stateFiles, err = vmStateFiles(dir, man); err != nil {
			return projections.Sandbox{}, err
		}
		if edit, err = m.restoreEdit(dir, man, child, copies); err != nil {
			return projections.Sandbox{}, err
		}
	}
	if err := m.preflightCopies(sources, 1, filesAllocated(dir, stateFiles), force); err != nil {
		return projections.Sandbox{}, err
	}
	handle, err := m.decideHandle(ctx, o.Handle)
	if err != nil {
		return projections.Sandbox{}, err
	}
	restoreFrom := ""
	var stage *sagas.Step
	if man.VMState {
		restoreFrom = filepath.Join(m.Root.SnapshotsOf(child), "restore")
		r := m.res(events.KindSnapshot, restoreFrom)
		stage = &sagas.Step{
			Name: "stage-restore",
			Do: func(context.Context) ([]events.Payload, error) {
				if err := stageRestore(string(m.Root), dir, restoreFrom, stateFiles, edit); err != nil {
					return nil, err
				}
				return []events.Payload{
					events.ResourceCreatedEvent{Resource: m.res(events.KindSnapshot, m.Root.SnapshotsOf(child))},
					events.ResourceCreatedEvent{Resource: r},
				}, nil
			},
			// The child's snapshots directory was made for the staged state
			// too: an undone restore leaves neither.
			Undo: func(context.Context) ([]events.Payload, error) {
				ps, err := m.reclaim(r, false, "compensation")
				if err != nil {
					return ps, err
				}
				more, err := m.dropEmptySnapshotsDir(projections.Sandbox{ID: child}, "compensation")
				return append(ps, more...), err
			},
		}
	}
	committed := func(rs []events.Resource) events.Payload {
		return events.SandboxRestoredEvent{Snapshot: strings.ToUpper(snap), Source: source.ID, Handle: o.Handle, Image: man.Image, Driver: source.Driver, Resources: rs, Bootstrap: man.Bootstrap, Boot: source.BootConfig, Labels: o.Labels}
	}
	if err := m.runChild(ctx, events.SagaRestore, child, source.ID, copies, committed, nil, false, restoreFrom, stage, nil, handle); err != nil {
		return projections.Sandbox{}, err
	}
	if man.VMState && man.Frozen {
		m.thawRestored(ctx, child)
	}
	return m.Find(context.WithoutCancel(ctx), child)
}
