package lifecycle

import (
	"context"
	"fmt"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// Rename gives the sandbox ref names the handle handle. The new handle
// follows every handle's rules (decideHandle, refuseHandleCollision); the
// sandbox.renamed goes into the journal with the handle's claim, expecting
// the sandbox and the handle as decided, so a handle claimed since, or a
// holder that appeared, is refused naming the holder. The old handle is
// free once the rename is in.
func (m *Manager) Rename(ctx context.Context, ref, handle string) (projections.Sandbox, error) {
	if handle == "" {
		return projections.Sandbox{}, fmt.Errorf("%w: a rename needs a new handle", ErrRefused)
	}
	c, err := m.claim(ctx, ref, core.Rename)
	if err != nil {
		return projections.Sandbox{}, err
	}
	defer c.release()
	sb := c.sb
	if sb.Handle == handle {
		return projections.Sandbox{}, fmt.Errorf("%w: sandbox %s is already %q", ErrRefused, sb.ID, handle)
	}
	hx, err := m.decideHandle(ctx, handle)
	if err != nil {
		return projections.Sandbox{}, err
	}
	if err := m.refuseHandleCollision(ctx, CreateSpec{Handle: handle}); err != nil {
		return projections.Sandbox{}, err
	}
	at := nowUTC()
	_, err = m.B.AppendExpect(context.WithoutCancel(ctx), append(c.expect(), hx...),
		events.New(ulid.Make(), at, sb.ID, events.SandboxRenamedEvent{Old: sb.Handle, Handle: handle}),
		events.New(ulid.Make(), at, sb.ID, events.HandleClaimedEvent{Sandbox: sb.ID, Handle: handle}))
	if err != nil {
		return projections.Sandbox{}, m.handleTaken(ctx, handle, sb.ID, err)
	}
	return m.writeRecord(ctx, sb.ID)
}
