package lifecycle

import (
	"context"
	"fmt"

	"github.com/nexus-sandbox/nexus/layout"
)

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
