package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	hostledger "github.com/nexus-sandbox/nexus/host/ledger"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// BindToRun lists a new sandbox in run (a client's NEXUS_RUN_ID; "" binds
// nothing) the instant before its create starts, under an id chosen now,
// so a sweep of a dead run finds every sandbox its create may have begun.
func BindToRun(m *lifecycle.Manager, run string, spec *lifecycle.CreateSpec) error {
	if run == "" {
		return nil
	}
	lr, err := hostledger.Attach(hostledger.Dir(string(m.Root)), run)
	if err != nil {
		return fmt.Errorf("%s=%s: %w", client.EnvRunID, run, err)
	}
	spec.ID = ulid.Make().String()
	return lr.Add(hostledger.Sandboxes, spec.ID)
}

// RemoveBound removes a sandbox and then drops it from run ("" drops
// nothing). A sandbox already gone is dropped too: the run no longer has it.
func RemoveBound(ctx context.Context, m *lifecycle.Manager, run, ref string, opt lifecycle.RemoveOptions) (lifecycle.Removed, error) {
	id := ref
	if sb, err := m.Lookup(ctx, ref); err == nil {
		id = sb.ID
	}
	rm, err := m.RemoveWith(ctx, ref, opt)
	if run != "" && (err == nil || errors.Is(err, lifecycle.ErrNotFound)) {
		if lr, aerr := hostledger.Attach(hostledger.Dir(string(m.Root)), run); aerr == nil {
			return rm, errors.Join(err, lr.Drop(hostledger.Sandboxes, id))
		}
	}
	return rm, err
}

// SweepActions carries a sweep's removals out with the lifecycle manager
// and journals its decisions (hostledger.Actions).
type SweepActions struct {
	m         *lifecycle.Manager
	recovered *bool
}

// NewSweepActions sweeps through m.
func NewSweepActions(m *lifecycle.Manager) SweepActions { return SweepActions{m, new(bool)} }

// RemoveSandbox finishes the sandbox's stranded saga if it has one, then
// removes it; found is false when there was nothing to remove.
func (a SweepActions) RemoveSandbox(ctx context.Context, name string) (bool, error) {
	sb, err := a.m.Find(ctx, name)
	if errors.Is(err, lifecycle.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := a.finishStranded(ctx, sb.ID); err != nil {
		return false, err
	}
	if sb, err = a.m.Find(ctx, name); errors.Is(err, lifecycle.ErrNotFound) {
		return true, nil // an uncommitted create, compensated
	} else if err != nil {
		return false, err
	}
	if err := a.m.Remove(ctx, sb.ID); err != nil {
		if errors.Is(err, lifecycle.ErrNotFound) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// finishStranded runs recover when the sandbox has an unfinished saga: the
// dead owner died inside its create (maybe after spawning a VMM it never
// journaled), or a killed sweeper inside its rm. Recover compensates or
// finishes those before rm runs. It is only safe while this process owns
// the journal: then every open saga's runner is dead. Behind a daemon
// another command may be mid-saga, so the sweep refuses and leaves the run
// for a later sweep (or `nexus recover`).
func (a SweepActions) finishStranded(ctx context.Context, id string) error {
	if *a.recovered {
		return nil
	}
	open, err := a.m.B.OpenSagas(ctx)
	if err != nil {
		return err
	}
	for _, sg := range open {
		if sg.Sandbox != id {
			continue
		}
		if _, remote := a.m.B.(*control.Client); remote {
			return fmt.Errorf("sandbox %s has an unfinished %s saga and a daemon serves the state root: run `nexus recover`", id, sg.Kind)
		}
		if _, err := a.m.Recover(ctx); err != nil {
			return fmt.Errorf("recover before sweeping: %w", err)
		}
		*a.recovered = true
		return nil
	}
	return nil
}

// RemoveNetwork: nexus has no network resources yet, so a listed network
// can only be one that does not exist ("not found" is ignored).
func (SweepActions) RemoveNetwork(context.Context, string) (bool, error) { return false, nil }

// Record journals the decision to sweep a run.
func (a SweepActions) Record(ctx context.Context, ev events.RunSweptEvent) error {
	_, err := a.m.B.Append(ctx, events.New(ulid.Make(), time.Now().UTC(), "", ev))
	return err
}

// RecordKept journals one keep decision.
func (a SweepActions) RecordKept(ctx context.Context, ev events.RunKeptEvent) error {
	return hostledger.JournalKept(ctx, a.m.B.Append, []events.RunKeptEvent{ev})
}
