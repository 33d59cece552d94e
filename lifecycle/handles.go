package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/intent"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// decideHandle checks that handle may name a new sandbox (create, or a
// fork or restore child): well formed, and held by no live sandbox. It
// returns the expectation the command's saga carries: the handle's last
// claim as this decision saw it, so that the store and the journal refuse
// the commit if anyone claimed the handle since. No handle, no
// expectation.
func (m *Manager) decideHandle(ctx context.Context, handle string) ([]core.Expect, error) {
	if handle == "" {
		return nil, nil
	}
	if !validHandle(handle) || strings.Contains(handle, "..") {
		return nil, fmt.Errorf("%w: handle %q: use letters, digits, '.', '_', '-', '/'", ErrRefused, handle)
	}
	// A reference is an ID, a handle or a prefix of an ID or short ID
	// (projections.Match): a handle that reads as an ID, or as a prefix of
	// a live sandbox's ID or short ID, would make one name mean two
	// sandboxes.
	if layout.IsULID(strings.ToUpper(handle)) {
		return nil, fmt.Errorf("%w: handle %q reads as a sandbox ID; choose a handle that does not", ErrRefused, handle)
	}
	if projections.IDPrefixLike(handle) {
		refs, err := m.B.Named(ctx, handle)
		if err != nil {
			return nil, err
		}
		if ids := projections.IDsNamedBy(refs, handle); len(ids) > 0 {
			return nil, fmt.Errorf("%w: handle %q is a prefix of the ID or short ID of sandbox %s; choose a handle that is not", ErrRefused, handle, strings.Join(ids, ", "))
		}
	}
	// The claim is read before the holder: a claim between the two reads
	// then shows as a holder, never as a free handle expected at a
	// sequence past its claim.
	rev, err := m.B.Rev(ctx, core.Handle(handle))
	if err != nil {
		return nil, err
	}
	if sb, err := m.Find(ctx, handle); err == nil {
		return nil, handleTakenError{fmt.Errorf("%w: handle %q is already in use by sandbox %s", ErrRefused, handle, sb.ID)}
	}
	return []core.Expect{{Entity: core.Handle(handle), Seq: rev}}, nil
}

// decided runs the manager's hook between a create-like command's
// decision and its first write (the tests stall a create there, as a
// loaded machine might).
func (m *Manager) decided(kind events.SagaKind) { m.at(kind, "decided") }

// published runs the manager's hook once a create-like command's intents
// are on disk and before its saga.started is journaled: the window in
// which only the command itself can retire them.
func (m *Manager) published(kind events.SagaKind) { m.at(kind, "intents-published") }

func (m *Manager) at(kind events.SagaKind, point string) {
	if m.Hook != nil {
		m.Hook(string(kind), point, sagas.AfterRecord)
	}
}

// handleTaken names the sandbox holding handle in the error of a command
// that was to give it to sandbox id and was refused because of it: the
// journal found the handle claimed since the decision. Other errors are
// returned as they are (the store's own refusal, core.HandleHeld, names
// the holder already).
func (m *Manager) handleTaken(ctx context.Context, handle, id string, err error) error {
	var stale *core.StaleError
	if handle == "" || !errors.As(err, &stale) || stale.Entity != core.Handle(handle) {
		return err
	}
	sb, found, ferr := m.B.Sandbox(context.WithoutCancel(ctx), handle)
	if ferr != nil || !found || sb.ID == id || sb.Handle != handle {
		return err
	}
	return handleTakenError{fmt.Errorf("%w: handle %q is held by sandbox %s (%w)", ErrRefused, handle, sb.ID, err)}
}

// handleTakenError is a refusal, as its message says, of a handle another
// sandbox holds: errors.Is finds core.ErrHandleTaken in it.
type handleTakenError struct{ error }

func (e handleTakenError) Unwrap() error        { return e.error }
func (e handleTakenError) Is(target error) bool { return target == core.ErrHandleTaken }

// dropIntents retires the intents of a saga that ended before its intents
// step ran: refused or interrupted before saga.started, or interrupted
// right after it. No event names them, so no undo would retire them, and
// nothing of the command may be left. One it cannot retire stays, and so
// does the runner's lease file (hold), which leads recover to it.
func dropIntents(m *Manager, hold *newHold, held []*intent.Held, intents []publishedIntent) {
	releaseAll(held)
	for _, in := range intents {
		if err := intent.Retire(m.Root.Abs(in.res.Path)); err != nil {
			hold.left = true
		}
	}
}

// refuseHandleCollision refuses, before anything is written, a handle
// whose shadow intent or shadow disks would land on a path the journal
// already attributes to a sandbox: that path is another sandbox's, and the
// create must not write or later delete it. layout.SafeHandle is
// injective, so two handles never share a name; what remains are paths of
// other naming schemes (a fork child's <ULID>-<parentSafeHandle> copies)
// and names written by an older nexus whose mapping was lossy.
func (m *Manager) refuseHandleCollision(ctx context.Context, spec CreateSpec) error {
	if spec.Handle == "" {
		return nil
	}
	paths := []string{m.rel(m.Root.ShadowIntent(spec.Handle))}
	for _, sh := range spec.Shadows {
		paths = append(paths, m.rel(m.Root.ShadowDisk(spec.Handle, sh.Name)))
	}
	owner, p, found, err := m.B.OwnerOf(ctx, paths, "")
	if err != nil {
		return err
	}
	if found {
		return fmt.Errorf("%w: handle %q: %s is already owned by sandbox %s", ErrRefused, spec.Handle, p, owner)
	}
	// <ULID>-... is the fork copies' namespace: a handle there could
	// later meet a child's copy, and the reaper would credit it to the child.
	if _, _, ok := layout.ForkPrefixed(spec.Handle); ok {
		return fmt.Errorf("%w: handle %q starts with a sandbox id and '-', which names fork copies", ErrRefused, spec.Handle)
	}
	return nil
}

// ownerOf names the sandbox other than id that the journal says owns rel,
// or "". Recovery of an uncommitted create deletes what its intent covers;
// a covered path another sandbox owns was never this saga's to delete. A
// journal that cannot be read is treated as owning it.
func (m *Manager) ownerOf(ctx context.Context, rel, id string) string {
	owner, _, _, err := m.B.OwnerOf(ctx, []string{rel}, id)
	if err != nil {
		return "(unknown: " + err.Error() + ")"
	}
	return owner
}
