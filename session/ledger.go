package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	hostledger "github.com/nexus-sandbox/nexus/host/ledger"
	"github.com/nexus-sandbox/nexus/ledger"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// Manage runs fn with a lifecycle manager over the state root; owned asks
// for the journal in this process (an on-demand daemon retires for it),
// which a sweep that removes needs (finishStranded).
type Manage func(ctx context.Context, owned bool, fn func(*lifecycle.Manager) error) error

// SweepRuns sweeps the dead runs of the prepared root (all but self.Run).
// It plans without the journal and opens it only if there is a decision
// to journal, so a sweep of an empty ledger costs a scan.
func SweepRuns(ctx context.Context, root string, self ledger.Self, by string, manage Manage) ([]ledger.Outcome, error) {
	dir := hostledger.Dir(root)
	plan, err := hostledger.Plan(dir, self, time.Now())
	if err != nil {
		return nil, err
	}
	if !hostledger.AnySweep(plan) && hostledger.KeptEvents(by, self, time.Now(), hostledger.Outcomes(plan)) == nil {
		return hostledger.Outcomes(plan), nil
	}
	var out []ledger.Outcome
	err = manage(ctx, hostledger.AnySweep(plan), func(m *lifecycle.Manager) error {
		var err error
		out, err = hostledger.Apply(ctx, dir, plan, self, by, NewSweepActions(m))
		return err
	})
	return out, err
}

// PlanRuns is what a sweep of the prepared root (all but self.Run) would
// decide, run by run, without the journal and without sweeping: a run to
// sweep lists the sandboxes it would remove.
func PlanRuns(root string, self ledger.Self) ([]ledger.Outcome, error) {
	dir := hostledger.Dir(root)
	plan, err := hostledger.Plan(dir, self, time.Now())
	if err != nil {
		return nil, err
	}
	out := hostledger.Outcomes(plan)
	for i := range out {
		if out[i].Verdict == string(ledger.Sweep) {
			out[i].WouldRemove = hostledger.ListedSandboxes(dir, out[i].Run)
		}
	}
	return out, nil
}

// WatchdogPatience bounds how long a watchdog waits for a busy journal.
const WatchdogPatience = 5 * time.Minute

// SweepWatched is a watchdog's sweep of its run once the run's owner has
// gone: nothing if a clean shutdown left no ledger, else the run's own
// sweep, one line of it written to log. The owner may have died while one
// of its own nexus commands holds the journal (a create that goes on to
// finish): it keeps waiting for the journal, up to WatchdogPatience,
// rather than leave the run to a later sweep.
func SweepWatched(ctx context.Context, root, run string, self ledger.Self, manage Manage, log io.Writer) error {
	dir := hostledger.Dir(root)
	if !hostledger.Exists(dir, run) {
		return nil
	}
	deadline := time.Now().Add(WatchdogPatience)
	for {
		err := manage(ctx, true, func(m *lifecycle.Manager) error {
			o, _, err := hostledger.SweepOwn(ctx, dir, run, self, "watchdog", NewSweepActions(m))
			fmt.Fprintf(log, "nexus watchdog: run %s: removed %v, not found %v %s%s\n", run, o.Removed, o.NotFound, o.Skipped, o.Error)
			if err == nil && o.Error != "" {
				err = errors.New(o.Error)
			}
			return err
		})
		if !errors.Is(err, control.ErrBusy) || time.Now().After(deadline) {
			return err
		}
	}
}

// JournalKept journals the keep decisions a client's own sweep made
// (run.kept events handed to the command) through m's backend.
func JournalKept(ctx context.Context, m *lifecycle.Manager, evs []events.RunKeptEvent) error {
	return hostledger.JournalKept(ctx, m.B.Append, evs)
}
