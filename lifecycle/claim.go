package lifecycle

import (
	"context"
	"errors"
	"fmt"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/sagalease"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// Every command on an existing sandbox starts the same way (the guard):
// take the sandbox's runner lease, read it afresh, decide with the pure
// core.Decide, and run its saga expecting the sandbox exactly as read. The
// lease keeps a second runner and recover off the sandbox until the saga
// ends; the expectation makes the journal refuse the saga if anything
// about the sandbox was journaled between the read and the saga's start.

// claim is a sandbox held for one command.
type claim struct {
	cmd   core.Command
	sb    projections.Sandbox
	lease *sagalease.Lease
}

// lease takes entity's runner lease for kind, waiting if the manager was
// asked to (--wait) and refusing at once, naming the holder, otherwise.
func (m *Manager) lease(ctx context.Context, entity core.Entity, kind string) (*sagalease.Lease, error) {
	l, err := sagalease.Acquire(ctx, string(m.Root), string(entity), sagalease.Holder{Kind: kind}, false)
	var held *sagalease.HeldError
	if errors.As(err, &held) && m.Wait {
		m.status("%s is busy: %s is running on it; waiting for it to end (--wait)", held.Entity, held.By)
		l, err = sagalease.Acquire(ctx, string(m.Root), string(entity), sagalease.Holder{Kind: kind}, true)
	}
	if errors.Is(err, sagalease.ErrHeld) {
		return nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return l, notStarted(ctx, kind, err)
}

// notStarted words an interruption that ends a command before its saga
// started (waiting for a lease, reading the state): nothing was done, and
// the error says so the way the saga's own refusal to start does.
func notStarted(ctx context.Context, kind string, err error) error {
	if err == nil || ctx.Err() == nil || errors.Is(err, sagas.ErrNotStarted) {
		return err
	}
	return fmt.Errorf("%s: %w: %w", kind, sagas.ErrNotStarted, context.Cause(ctx))
}

// claim resolves ref, takes its lease and decides cmd on the fresh state.
func (m *Manager) claim(ctx context.Context, ref string, cmd core.Command) (*claim, error) {
	sb, err := m.Lookup(ctx, ref)
	if err != nil {
		return nil, notStarted(ctx, string(cmd), err)
	}
	l, err := m.lease(ctx, core.Sandbox(sb.ID), string(cmd))
	if err != nil {
		return nil, err
	}
	c := &claim{cmd: cmd, lease: l}
	if err := c.decide(ctx, m, sb.ID); err != nil {
		l.Release()
		return nil, notStarted(ctx, string(cmd), err)
	}
	return c, nil
}

// decide reads the sandbox and the open sagas again and applies core.Decide.
func (c *claim) decide(ctx context.Context, m *Manager, id string) error {
	sb, err := m.Find(ctx, id)
	if err != nil {
		return err
	}
	open, err := m.B.OpenSagas(ctx)
	if err != nil {
		return err
	}
	// Decide on what a reader sees: a VMM dead by pid + start time is
	// exited even before any daemon journaled it.
	sb = observeExits(sb)
	err = core.Decide(c.cmd, sb, open)
	var r *core.Refusal
	if errors.As(err, &r) && r.Saga != nil && r.Saga.Sandbox == id {
		// We hold the sandbox's lease, so the saga's runner is dead:
		// finish it the way recover would, then decide on what it left.
		var rep RecoverReport
		if rerr := m.recoverSaga(ctx, *r.Saga, &rep); rerr != nil {
			return fmt.Errorf("refused: %w (finishing it: %v)", err, rerr)
		}
		if sb, err = m.Find(ctx, id); err != nil {
			return err
		}
		sb = observeExits(sb)
		if open, err = m.B.OpenSagas(ctx); err != nil {
			return err
		}
		err = core.Decide(c.cmd, sb, open)
	}
	if errors.Is(err, core.ErrAlready) {
		return err // nothing to do is not a refusal
	}
	if err != nil {
		return fmt.Errorf("refused: %w", err)
	}
	c.sb = sb
	return nil
}

func (c *claim) release() { c.lease.Release() }

// expect is what the saga's appends expect of the claimed sandbox.
func (c *claim) expect() []core.Expect {
	return []core.Expect{{Entity: core.Sandbox(c.sb.ID), Seq: c.sb.Rev}}
}

// run runs the saga build makes from the claimed state. If the journal
// refuses its start as stale (something about the sandbox was journaled
// since the read), it reads and decides again, and runs a saga built from
// the new state; a decision that no longer holds is the command's error.
func (m *Manager) run(ctx context.Context, c *claim, build func(projections.Sandbox) *sagas.Saga) error {
	for attempt := 1; ; attempt++ {
		s := build(c.sb)
		s.Expect = append(s.Expect, c.expect()...)
		c.lease.Set(sagalease.Holder{Kind: string(s.Kind), Saga: s.ID})
		err := s.Run(ctx, m.B)
		var stale *core.StaleError
		if !errors.As(err, &stale) || !errors.Is(err, sagas.ErrNotStarted) || attempt == 3 {
			return err
		}
		if derr := c.decide(ctx, m, c.sb.ID); derr != nil {
			return fmt.Errorf("%w (%v)", derr, stale)
		}
	}
}

// newHold is the runner leases a create-like saga holds: the new
// sandbox's first, then its volumes'.
type newHold struct {
	leases []*sagalease.Lease
	// left is set when the flow leaves intents on disk that no event
	// names: the sandbox's lease file then stays, as a dead runner's
	// would, for recover's intent sweep to follow.
	left bool
}

func (h *newHold) release() {
	for i, l := range h.leases {
		if i == 0 && h.left {
			l.Abandon()
			continue
		}
		l.Release()
	}
}

// holdNew takes the leases a create-like saga needs: the new sandbox's
// and, for each volume it attaches, the volume's. The sandbox's lease
// file is made durable before the flow publishes an intent: if the flow
// dies, the file is what leads recover to the intents (sweepIntents). The
// volumes are read again under their leases and decided
// (core.DecideAttach), and their revisions become expectations of the
// saga, so a `volume rm` decided on the same state can never also
// succeed: one of the two is refused by the lease or, failing that, by
// the journal.
func (m *Manager) holdNew(ctx context.Context, kind events.SagaKind, id string, mounts []Mount, readOnly bool) (*newHold, []core.Expect, error) {
	h := &newHold{}
	l, err := m.lease(ctx, core.Sandbox(id), string(kind))
	if err != nil {
		return nil, nil, err
	}
	h.leases = append(h.leases, l)
	if err := l.Sync(); err != nil {
		h.release()
		return nil, nil, err
	}
	expect := []core.Expect{{Entity: core.Sandbox(id), Seq: 0}}
	if len(mounts) == 0 {
		return h, expect, nil
	}
	for _, mt := range mounts {
		l, err := m.lease(ctx, core.Volume(mt.Name), string(kind))
		if err != nil {
			h.release()
			return nil, nil, err
		}
		h.leases = append(h.leases, l)
	}
	vols, err := m.B.Volumes(ctx)
	if err != nil {
		h.release()
		return nil, nil, err
	}
	byName := map[string]*projections.Volume{}
	for i := range vols {
		byName[vols[i].Name] = &vols[i]
	}
	for _, mt := range mounts {
		v := byName[mt.Name]
		if !readOnly {
			if err := core.DecideAttach(v, mt.Name); err != nil {
				h.release()
				return nil, nil, fmt.Errorf("refused: %w", err)
			}
		} else if v == nil {
			h.release()
			return nil, nil, fmt.Errorf("%w: no volume %q", ErrNotFound, mt.Name)
		}
		expect = append(expect, core.Expect{Entity: core.Volume(mt.Name), Seq: v.Rev})
	}
	return h, expect, nil
}
