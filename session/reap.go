package session

import (
	"context"
	"errors"
	"fmt"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// Reap reaches the journal of the prepared state root and reaps. A journal
// that cannot be fully read (damaged, newer schema) is not an error to
// stop at: the scan still runs, everything is kept, and the report says
// why, since what cannot be attributed might still be in use; --apply is
// then refused. A nil report means there is nothing
// to print.
func Reap(ctx context.Context, root string, co control.ConnectOptions, hook lifecycle.Hook, o lifecycle.ReapOptions) (*lifecycle.ReapReport, error) {
	unreadable := func(why error) (*lifecycle.ReapReport, error) {
		rep, serr := lifecycle.ReapUnreadable(root, why.Error(), o)
		if serr != nil {
			return nil, serr
		}
		if o.Apply {
			return &rep, fmt.Errorf("reap --apply refused, nothing deleted: journal cannot be fully read: %v", why)
		}
		return &rep, nil
	}
	b, err := control.ConnectWith(ctx, root, co)
	if err != nil {
		// A bad root, a busy journal, a build that cannot open the store
		// or an interruption says nothing about whether the journal is
		// readable.
		if errors.Is(err, control.ErrStateRoot) || errors.Is(err, control.ErrBusy) || errors.Is(err, control.ErrInProcess) || ctx.Err() != nil {
			return nil, err
		}
		return unreadable(err)
	}
	m, err := lifecycle.New(lifecycle.Manager{Root: layout.Root(root), B: b, Hook: hook})
	if err != nil {
		return nil, errors.Join(err, b.Close())
	}
	rep, err := m.Reap(ctx, o)
	err = errors.Join(err, b.Close())
	switch {
	case errors.Is(err, lifecycle.ErrJournalUnreadable) && ctx.Err() == nil:
		return unreadable(err)
	case errors.Is(err, lifecycle.ErrPlanNotFound):
		return nil, err
	}
	return &rep, err
}
