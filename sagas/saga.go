// Package sagas sequences the steps of multi-step flows (create, fork,
// restore, rm, recovery) over the journal. A step does its work, then its
// event is appended; a failed step makes the saga undo the steps already
// done, newest first, and record itself compensated. Sagas decide order and
// nothing else: the work lives in host/, the facts in events/.
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

// Step is one unit of a saga. Do performs it and returns the event that
// says it happened; Undo, if set, reverses it during compensation.
type Step struct {
	Name string
	Do   func(ctx context.Context) (events.Payload, error)
	Undo func(ctx context.Context) error
}

// Saga is one run of a flow.
type Saga struct {
	ID      string
	Kind    string
	Sandbox string
	Steps   []Step
	// AfterStep, if set, runs after each step's event is acknowledged. The
	// crash tests use it to kill the process at an exact step.
	AfterStep func(kind, step string)
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
	names := make([]string, len(s.Steps))
	for i, st := range s.Steps {
		names[i] = st.Name
	}
	if err := s.record(ctx, j, "", events.SagaStartedEvent{Kind: s.Kind, Steps: names}); err != nil {
		return fmt.Errorf("%s: start: %w", s.Kind, err)
	}
	for i, st := range s.Steps {
		p, err := st.Do(ctx)
		if err == nil && p != nil {
			err = s.record(ctx, j, st.Name, p)
		}
		if err != nil {
			return s.compensate(ctx, j, i, fmt.Errorf("%s: %s: %w", s.Kind, st.Name, err))
		}
		if s.AfterStep != nil {
			s.AfterStep(s.Kind, st.Name)
		}
	}
	if err := s.record(ctx, j, "", events.SagaFinishedEvent{}); err != nil {
		return fmt.Errorf("%s: finish: %w", s.Kind, err)
	}
	return nil
}

// compensate undoes steps [0, failed] newest first; the failed step may
// have done part of its work, so it is undone too.
func (s *Saga) compensate(ctx context.Context, j Journal, failed int, cause error) error {
	var undoErrs []error
	for i := failed; i >= 0; i-- {
		if u := s.Steps[i].Undo; u != nil {
			if err := u(ctx); err != nil {
				undoErrs = append(undoErrs, fmt.Errorf("undo %s: %w", s.Steps[i].Name, err))
			}
		}
	}
	if len(undoErrs) > 0 {
		// Leave the saga open: recover must finish the compensation.
		return errors.Join(cause, errors.Join(undoErrs...))
	}
	if err := s.record(ctx, j, "", events.SagaCompensatedEvent{Reason: cause.Error()}); err != nil {
		return errors.Join(fmt.Errorf("%w: %w", ErrCompensated, cause), err)
	}
	return fmt.Errorf("%w: %w", ErrCompensated, cause)
}

func (s *Saga) record(ctx context.Context, j Journal, step string, p events.Payload) error {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	e := events.New(ulid.Make(), now(), s.Sandbox, p)
	e.Saga = s.ID
	e.Step = step
	if step == "" {
		e.Step = string(p.EventType()) // saga.started / finished / compensated are steps of their own for de-duplication
	}
	_, err := j.Append(ctx, e)
	return err
}
