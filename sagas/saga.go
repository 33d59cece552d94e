// Package sagas sequences the steps of multi-step flows (create, fork,
// restore, rm, recovery) over the journal. A step does its work, then its
// events are appended; a failed step makes the saga undo the steps already
// done, newest first, record what each undo reclaimed, and close itself
// compensated. Sagas decide order and nothing else: the work lives in
// host/, the facts in events/.
package sagas

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

// Journal is where a saga records its steps.
type Journal interface {
	Append(ctx context.Context, evs ...events.Event) ([]uint64, error)
}

// Step is one unit of a saga. Do performs it and returns the events that
// say what happened (none is fine); Undo, if set, reverses it during
// compensation and returns the events that say what it reclaimed.
type Step struct {
	Name string
	Do   func(ctx context.Context) ([]events.Payload, error)
	Undo func(ctx context.Context) ([]events.Payload, error)
}

// Phase says where a hook runs relative to a step's events.
type Phase string

const (
	// BeforeRecord: the step's effect exists, its events are not yet journaled.
	BeforeRecord Phase = "before"
	// AfterRecord: the step's events are acknowledged.
	AfterRecord Phase = "after"
)

// Saga is one run of a flow.
type Saga struct {
	ID      string
	Kind    string
	Sandbox string
	Steps   []Step
	// Done lists steps a previous, interrupted run already journaled; a
	// resumed run skips them and does not journal saga.started again. The
	// journal's de-duplication window is short, so resumption must not rely
	// on it (NOTES-nats: check the journal for the step's id on resume).
	Done map[string]bool
	// Hook, if set, runs around each step. The crash tests use it to SIGKILL
	// the process at an exact point.
	Hook func(kind, step string, phase Phase)
	// Now is the clock stamped on events (time.Now if nil).
	Now func() time.Time
}

// ErrCompensated wraps the error of a step that failed and was undone.
var ErrCompensated = errors.New("saga compensated")

// Run records the saga's start, runs every step in order, and records the
// end. On a step failure it undoes the completed steps in reverse and
// returns an error wrapping both ErrCompensated and the step's error.
func (s *Saga) Run(ctx context.Context, j Journal) error {
	if s.ID == "" {
		s.ID = ulid.Make().String()
	}
	if len(s.Done) == 0 {
		names := make([]string, len(s.Steps))
		for i, st := range s.Steps {
			names[i] = st.Name
		}
		if err := s.record(ctx, j, string(events.SagaStarted), events.SagaStartedEvent{Kind: s.Kind, Steps: names}); err != nil {
			return fmt.Errorf("%s: start: %w", s.Kind, err)
		}
	}
	for i, st := range s.Steps {
		if s.Done[st.Name] {
			continue
		}
		ps, err := st.Do(ctx)
		if err == nil {
			s.hook(st.Name, BeforeRecord)
			err = s.record(ctx, j, st.Name, ps...)
		}
		if err != nil {
			return s.compensate(ctx, j, i, fmt.Errorf("%s: %s: %w", s.Kind, st.Name, err))
		}
		s.hook(st.Name, AfterRecord)
	}
	if err := s.record(ctx, j, string(events.SagaFinished), events.SagaFinishedEvent{}); err != nil {
		return fmt.Errorf("%s: finish: %w", s.Kind, err)
	}
	return nil
}

func (s *Saga) hook(step string, phase Phase) {
	if s.Hook != nil {
		s.Hook(s.Kind, step, phase)
	}
}

// Compensate undoes every step (newest first) and closes the saga as
// compensated. Recovery calls it for a saga whose process died.
func (s *Saga) Compensate(ctx context.Context, j Journal, reason string) error {
	err := s.compensate(ctx, j, len(s.Steps)-1, errors.New(reason))
	if errors.Is(err, ErrCompensated) {
		return nil
	}
	return err
}

// compensate undoes steps [0, failed] newest first; the failed step may
// have done part of its work, so it is undone too. Undo must therefore
// tolerate work that was never done.
func (s *Saga) compensate(ctx context.Context, j Journal, failed int, cause error) error {
	var undoErrs []error
	for i := failed; i >= 0; i-- {
		st := s.Steps[i]
		if st.Undo == nil {
			continue
		}
		ps, err := st.Undo(ctx)
		if err == nil {
			err = s.record(ctx, j, "undo."+st.Name, ps...)
		}
		if err != nil {
			undoErrs = append(undoErrs, fmt.Errorf("undo %s: %w", st.Name, err))
		}
	}
	if len(undoErrs) > 0 {
		// Leave the saga open: recover must finish the compensation.
		return errors.Join(cause, errors.Join(undoErrs...))
	}
	if err := s.record(ctx, j, string(events.SagaCompensated), events.SagaCompensatedEvent{Reason: cause.Error()}); err != nil {
		return errors.Join(fmt.Errorf("%w: %w", ErrCompensated, cause), err)
	}
	return fmt.Errorf("%w: %w", ErrCompensated, cause)
}

// record journals a step's events. Each gets a step name unique within the
// saga (name, name#2, ...), which is also its de-duplication id.
func (s *Saga) record(ctx context.Context, j Journal, step string, ps ...events.Payload) error {
	if len(ps) == 0 {
		return nil
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	evs := make([]events.Event, 0, len(ps))
	for i, p := range ps {
		e := events.New(ulid.Make(), now(), s.Sandbox, p)
		e.Saga, e.Step = s.ID, step
		if i > 0 {
			e.Step = fmt.Sprintf("%s#%d", step, i+1)
		}
		evs = append(evs, e)
	}
	_, err := j.Append(ctx, evs...)
	return err
}

// One is a convenience for a step that journals one event.
func One(p events.Payload) []events.Payload { return []events.Payload{p} }
