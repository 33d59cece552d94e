// Package lifecycle composes the sandbox flows (create, fork, snapshot,
// restore, start, stop, rm, recover, volumes) from host operations, saga
// steps and journal events. Each flow is a sagas.Saga whose steps call host/
// and return the events that say what they did; this package decides what
// the steps are, host/ does them, the journal remembers them.
package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

var (
	// ErrRefused marks an operation refused before it changed anything
	// (the guard's refusals are the same error).
	ErrRefused = core.ErrRefused
	// ErrAlready marks a stop of a stopped sandbox or a start of a running
	// one: the command's end state already holds (core.Already).
	ErrAlready = core.ErrAlready
	// ErrHandleTaken marks a refusal of a handle another live sandbox
	// holds (core.ErrHandleTaken).
	ErrHandleTaken = core.ErrHandleTaken
	// ErrNotFound marks an unknown sandbox, snapshot or volume.
	ErrNotFound = errors.New("not found")
)

// Backend is what the flows need of the journal and its projections:
// appends (guarded by the sequences a decision saw, or not), the events
// they re-read, and the views they decide on. It is declared once, here
// by its consumer: control.Backend (a daemon client or a store this
// process owns) embeds it and adds only what commands alone need, so the
// two cannot drift, and lifecycle imports no control.
type Backend interface {
	Append(ctx context.Context, evs ...events.Event) ([]uint64, error)
	AppendExpect(ctx context.Context, expect []core.Expect, evs ...events.Event) ([]uint64, error)
	Events(ctx context.Context, q events.Query, fn func(events.Record) error) error
	Sandboxes(ctx context.Context) ([]projections.Sandbox, error)
	// WithProcesses is every sandbox that records a process, running or
	// exited: an index of the store, so recover costs what runs.
	WithProcesses(ctx context.Context) ([]projections.Sandbox, error)
	// Sandbox is one sandbox by id or handle; found is false if there is none.
	Sandbox(ctx context.Context, ref string) (sb projections.Sandbox, found bool, err error)
	// Named is the sandboxes ref could name by projections.Match (its
	// handle's holder, those whose ID or short ID it is a prefix of), in
	// ID order, for Match to choose from: the store's indexes, not the
	// sandbox list.
	Named(ctx context.Context, ref string) ([]projections.Ref, error)
	OpenSagas(ctx context.Context) ([]projections.OpenSaga, error)
	Volumes(ctx context.Context) ([]projections.Volume, error)
	ImageCache(ctx context.Context) (projections.ImageCacheState, error)
	// Bootstrap is the cache entry sandbox id's OS disk came from (zero if
	// the journal recorded none), without the cache's list of every user.
	Bootstrap(ctx context.Context, id string) (events.Bootstrap, error)
	// OwnerOf names the sandbox other than except whose resources include
	// one of paths (found false if none): one answer, not the sandbox list.
	OwnerOf(ctx context.Context, paths []string, except string) (sandbox, path string, found bool, err error)
	// PathOwners is, for each of paths, the sandbox owning it by
	// projections.PathOwner's rule ("" for none): point lookups in the
	// store's ownership index, what the reaper marks from.
	PathOwners(ctx context.Context, paths []string) ([]string, error)
	// Rev is the sequence of the last event about entity (0: none): what
	// a decision about it expects (for a handle, its last claim).
	Rev(ctx context.Context, entity core.Entity) (uint64, error)
	// SnapshotOwner is the sandbox holding snapshot snap (an exact ID);
	// found is false if none does. One answer, not the sandbox list.
	SnapshotOwner(ctx context.Context, snap string) (sb projections.Sandbox, found bool, err error)
	// SnapshotsNamed is the snapshots ref could name by
	// projections.MatchSnapshot (those whose ID or short ID it is a
	// prefix of), each with its sandbox, for MatchSnapshot to choose
	// from: the store's snapshot indexes, not the sandbox list.
	SnapshotsNamed(ctx context.Context, ref string) ([]projections.SnapshotRef, error)
}

// Already is the ErrAlready of one command: the state its sandbox is
// already in.
type Already = core.Already

// Hook runs around a saga step: after its effect (sagas.BeforeRecord) and
// after its events are journaled (sagas.AfterRecord).
type Hook = func(kind, step string, phase sagas.Phase)

// DefaultFlushDeadline is how long stop waits for the guest agent's flush,
// and fork and snapshot for its freeze, unless told otherwise.
const DefaultFlushDeadline = vmm.DefaultFlushDeadline

// Manager runs flows against one state root.
type Manager struct {
	Root layout.Root
	B    Backend
	// Driver is what a new sandbox is made with (its name, kernel,
	// initramfs and command line, which its record keeps) and this host's
	// binaries. A sandbox already made boots as its record says (bootOf).
	Driver driver.Driver
	// AskedDriver is the driver the command named explicitly (--driver),
	// "" if none: a sandbox recorded with another one is refused
	// (core.DecideDriver) rather than booted under either.
	AskedDriver string
	// Cpus and MemoryBytes size a new sandbox whose create names no size
	// (config cpus, memory; zero: DefaultCpus, DefaultMemory).
	Cpus        int
	MemoryBytes int64
	// RootMode is how a new sandbox's root is made (config root; "":
	// an overlay when its guest runs nexus's agent as init, else a copy:
	// core.RootMode).
	RootMode string
	// Launcher starts the supervisors and VMMs (Spawner in production); a
	// flow that would start one without it is refused (ErrNoLauncher).
	Launcher Launcher
	// Hook runs around every saga step (crash tests set it).
	Hook Hook
	// OverlayMiB is the size of a new sandbox's workspace (overlay) disk
	// (config overlay_disk_mib); existing overlays are never resized to it.
	OverlayMiB int64
	// WarnFillRatio is the overlay fill ratio at which start raises an
	// OverlayNearlyFull warning (config overlay_warn_fill_ratio).
	WarnFillRatio float64
	// StartTimeout bounds how long a VMM or supervisor may take to answer.
	StartTimeout time.Duration
	// Progress, if set, shows long copies to a person (nil: nothing).
	Progress Progress
	// Wait makes a command wait for another command's saga on the same
	// sandbox or volume to end, instead of refusing (--wait).
	Wait bool
	// FlushDeadline bounds how long stop waits for the guest agent's
	// flush, and FreezeDeadline how long fork and snapshot wait for its
	// freeze (0: DefaultFlushDeadline).
	FlushDeadline, FreezeDeadline time.Duration
	// Notice, if set, tells the operator something that did not fail the
	// command but changes what comes next (a stop without a flush).
	Notice func(msg string)
	// ReadyTimeout bounds how long exec and cp wait for a sandbox that is
	// not Ready yet (0: DefaultReadyTimeout).
	ReadyTimeout time.Duration
	// Status, if set, tells the operator what a command is waiting for.
	Status func(msg string)
}

func (m *Manager) status(format string, args ...any) {
	if m.Status != nil {
		m.Status(fmt.Sprintf(format, args...))
	}
}

func (m *Manager) notice(format string, args ...any) {
	if m.Notice != nil {
		m.Notice(fmt.Sprintf(format, args...))
	}
}

// DefaultOverlayMiB is a new sandbox's overlay size when none is configured.
const DefaultOverlayMiB = 256

// DefaultWarnFillRatio is the overlay fill ratio start warns at when none
// is configured (the overlay plan's default).
const DefaultWarnFillRatio = core.DefaultWarnFillRatio

func (m *Manager) overlayBytes() int64 {
	if m.OverlayMiB <= 0 {
		return DefaultOverlayMiB << 20
	}
	return m.OverlayMiB << 20
}

func (m *Manager) startTimeout() time.Duration {
	if m.StartTimeout <= 0 {
		return 15 * time.Second
	}
	return m.StartTimeout
}

func (m *Manager) saga(kind events.SagaKind, sandbox string, steps []sagas.Step) *sagas.Saga {
	return &sagas.Saga{ID: ulid.Make().String(), Kind: kind, Sandbox: sandbox, Steps: steps, Hook: m.Hook, Forward: kind.Teardown()}
}

// sandboxes returns the current view of every sandbox.
func (m *Manager) sandboxes(ctx context.Context) ([]projections.Sandbox, error) {
	return m.B.Sandboxes(ctx)
}

// Find resolves an id or handle to a committed or in-flight sandbox.
func (m *Manager) Find(ctx context.Context, ref string) (projections.Sandbox, error) {
	sb, found, err := m.B.Sandbox(ctx, ref)
	if err != nil {
		return projections.Sandbox{}, err
	}
	if !found {
		return projections.Sandbox{}, fmt.Errorf("%w: no sandbox %q", ErrNotFound, ref)
	}
	return sb, nil
}

// Lookup resolves what an operator typed (an ID, a handle or a unique ID
// prefix: projections.Match) to a committed or in-flight sandbox. Flows
// given an ID they already hold use Find.
func (m *Manager) Lookup(ctx context.Context, ref string) (projections.Sandbox, error) {
	return Lookup(ctx, m.B, ref)
}

// Lookup is Manager.Lookup for commands that only read. An exact ID or
// handle is one per-entity read; any other reference (a short ID, or a
// prefix of one or of an ID) asks the store's indexes for the sandboxes
// it could name (Named) and lets projections.Match choose, so a command
// naming its sandbox costs the same at 10 sandboxes and 100,000.
func Lookup(ctx context.Context, b Backend, ref string) (projections.Sandbox, error) {
	if sb, found, err := b.Sandbox(ctx, ref); err != nil || found {
		return sb, err
	}
	refs, err := b.Named(ctx, ref)
	if err != nil {
		return projections.Sandbox{}, err
	}
	id, err := projections.Match(refs, ref)
	if errors.Is(err, projections.ErrNoMatch) {
		return projections.Sandbox{}, fmt.Errorf("%w: no sandbox %q", ErrNotFound, ref)
	}
	if err != nil {
		return projections.Sandbox{}, err
	}
	sb, found, err := b.Sandbox(ctx, id)
	if err == nil && !found {
		err = fmt.Errorf("%w: no sandbox %q (%s is gone)", ErrNotFound, ref, id)
	}
	return sb, err
}

func (m *Manager) rel(path string) string { return m.Root.Rel(path) }

func (m *Manager) res(kind events.ResourceKind, path string) events.Resource {
	return events.Resource{Kind: kind, Path: m.rel(path)}
}

// ensureDirs creates the state-root directories a flow writes into,
// refusing any that is a symlink.
func (m *Manager) ensureDirs(rels ...string) error {
	for _, rel := range rels {
		if err := fsx.EnsureDir(string(m.Root), rel); err != nil {
			return fmt.Errorf("%w: %v", ErrRefused, err)
		}
	}
	return nil
}

// reclaim deletes a resource symlink-safely and says so; a resource that is
// already gone yields no event unless the journal still owned it.
func (m *Manager) reclaim(r events.Resource, owned bool, by string) ([]events.Payload, error) {
	err := fsx.Remove(string(m.Root), r.Path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if !owned {
			return nil, nil
		}
	case err != nil:
		return nil, err
	}
	return sagas.One(events.ResourceReclaimedEvent{Resource: r, By: by}), nil
}

// Flows call writeRecord once their saga ended, and read back what they
// return under context.WithoutCancel: an interruption that came after the
// last step must not turn a finished command into a failure.
//
// writeRecord publishes sandboxes/<id>/record.json, the derived record an
// operator or another tool can read without the journal. It is rebuilt
// from the journal on every lifecycle change, so it can never be the only
// copy of anything. It returns the sandbox it read (zero if it could not
// read one), so a flow that answers with it reads it once, not twice.
func (m *Manager) writeRecord(ctx context.Context, id string) (projections.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	sb, err := m.Find(ctx, id)
	if err != nil {
		return projections.Sandbox{}, err
	}
	data, err := json.MarshalIndent(sb, "", "  ")
	if err != nil {
		return sb, err
	}
	dir := filepath.Dir(m.Root.Record(id))
	if err := fsx.MkdirAll(string(m.Root), dir, 0o700); err != nil {
		return sb, err
	}
	return sb, fsx.WriteFile(string(m.Root), m.Root.Record(id), append(data, '\n'), 0o600)
}

// recordAndRead is writeRecord for a flow that answers with the sandbox:
// the record is best effort, the answer is not.
func (m *Manager) recordAndRead(ctx context.Context, id string) (projections.Sandbox, error) {
	sb, err := m.writeRecord(ctx, id)
	if sb.ID != "" {
		return sb, nil
	}
	return sb, err
}
