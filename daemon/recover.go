package daemon

import (
	"context"
	"log/slog"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// recoverSagas finishes, with the manager newManager makes over b, every
// saga whose runner lease is free: a killed daemon, or a command that died
// with no daemon, leaves nothing open for long. It returns what to log
// once the daemon serves (nil: nothing to say), so "serving" stays the
// first line.
func recoverSagas(ctx context.Context, log *slog.Logger, newManager func(control.Backend) (*lifecycle.Manager, error), b control.Backend) func() {
	m, err := newManager(b)
	var rep lifecycle.RecoverReport
	if err == nil {
		rep, err = m.RecoverSagas(ctx)
	}
	switch {
	case err != nil:
		return func() { log.Error("finishing interrupted sagas failed; run `nexus recover`", "err", err) }
	case len(rep.Compensated)+len(rep.Resumed)+len(rep.Intents) > 0:
		return func() {
			log.Info("finished interrupted sagas", "compensated", len(rep.Compensated), "resumed", len(rep.Resumed), "intents_removed", len(rep.Intents))
		}
	}
	return nil
}
