package control

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
)

// ErrNotMirroring: no daemon serves the root, or it serves it without a
// mirror. Mirroring lives in a daemon started with --mirror, never in a
// command's own process, so there is nothing else to ask.
var ErrNotMirroring = errors.New("not mirroring")

// FleetStatus asks the root's daemon for its mirror's state.
func FleetStatus(ctx context.Context, root string) (*fleetstate.MirrorState, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	c, err := Dial(ctx, filepath.Join(abs, wire.SocketName))
	if err != nil {
		return nil, fmt.Errorf("%w: no daemon serves %s (mirroring runs in `nexus daemon --mirror`)", ErrNotMirroring, root)
	}
	defer c.Close()
	st, err := c.Mirror(ctx)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, fmt.Errorf("%w: the daemon of %s was started without --mirror", ErrNotMirroring, root)
	}
	return st, nil
}
