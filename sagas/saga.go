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
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
)

// Journal is where a saga records its steps.
type Journal interface {
	Append(ctx context.Context, evs ...events.Event) ([]uint64, error)
}

// GuardedJournal also refuses an append decided on stale state.
type GuardedJournal interface {
	Journal
	AppendExpect(ctx context.Context, expect []core.Expect, evs ...events.Event) ([]uint64, error)
}

// Step is one unit of a saga. Do performs it and returns the events that
// say what happened (none is fine); Undo, if set, reverses it during
// compensation and returns the events that say what it reclaimed.
type Step struct {
	Name string
	Do   func(ctx context.Context) ([]events.Payload, error)
	Undo func(ctx context.Context) ([]events.Payload, error)
	// Pivot marks the point of no return (a create's commit): once its
	// events are journaled the saga only goes forward, so a later failure
	// undoes the steps after it and keeps this one and everything before.
	// A pivot's events are never held for a later append.
	Pivot bool
	// Defer holds the step's events for the next step's append, which
	// records both: one fsynced append instead of two. Set it only where
	// the step's effect need not be durable before the next step runs:
	// recovering a crash after both ran, neither journaled, must be what
	// recovering one before this step was journaled is. A step that fails
	// or an interruption records what is held first, then compensates.
	// The step's AfterRecord hook runs once the append is acknowledged.
	Defer bool
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
	Kind    events.SagaKind
	Sandbox string
	Steps   []Step
	// Done lists steps a previous, interrupted run already journaled; a
	// resumed run skips them and does not journal saga.started again. The
	// journal's de-duplication window is short, so resumption must not rely
	// on it (NOTES-nats: check the journal for the step's id on resume).
	Done map[string]bool
	// Expect holds the entity sequences the decision to run this saga saw.
	// When set, saga.started and every forward step are appended only if
	// those entities have not moved since (the saga advances each to what
	// it last wrote), so a decision taken on stale state is refused by the
	// journal. Compensation is never guarded: it records what was undone.
	Expect []core.Expect
	// Forward marks a saga that only goes forward (a teardown such as rm
	// or stop, whose steps have nothing to undo): an interruption does not
	// stop it between steps, and a failed step leaves it open for recover
	// to finish rather than closing it half done.
	Forward bool
	// Hook, if set, runs around each step, and once saga.started is
	// journaled (step "saga.started", AfterRecord). The crash tests use it
	// to SIGKILL the process at an exact point.
	Hook func(kind, step string, phase Phase)
	// Now is the clock stamped on events (time.Now if nil).
	Now func() time.Time
	// RecordTimeout bounds each journal append and CompensateTimeout the
	// whole compensation. Both run under a context an interruption does
	// not cancel: a step that took effect is recorded, and an interrupted
	// saga undoes and journals its work to the end (defaults 1 and 5 min).
	RecordTimeout     time.Duration
	CompensateTimeout time.Duration
}

// Tracer hears each saga run and each of its steps begin and end: a
// trace exporter's hook, set by the command's process (SetTracer). Start
// returns the context the saga or step runs under and the function that
// ends it with the run's error (nil: it succeeded).
type Tracer interface {
	Start(ctx context.Context, span Span) (context.Context, func(error))
}

// Span names what a Tracer is told of: a saga (Step "") or one of its
// steps, an undo's named undo.<step>.
type Span struct {
	Kind    events.SagaKind
	Saga    string // the saga's ID
	Sandbox string
	Step    string
}

// tracer is the process's Tracer; nil traces nothing.
var tracer Tracer

// SetTracer makes t hear every saga this process runs (nil: none). Call it
// before any saga runs.
func SetTracer(t Tracer) { tracer = t }

func (s *Saga) trace(ctx context.Context, step string) (context.Context, func(error)) {
	if tracer == nil {
		return ctx, func(error) {}
	}
	return tracer.Start(ctx, Span{Kind: s.Kind, Saga: s.ID, Sandbox: s.Sandbox, Step: step})
}

var (
	// ErrCompensated wraps the error of a step that failed and was undone.
	ErrCompensated = errors.New("saga compensated")
	// ErrNotStarted means saga.started was not journaled: nothing ran.
	ErrNotStarted = errors.New("saga not started")
	// ErrLeftOpen means compensation stopped at a step it could not undo
	// or could not journal; the saga stays open for `nexus recover`.
	ErrLeftOpen = errors.New("saga left open for `nexus recover`")
)

// Run records the saga's start, runs every step in order, and records the
// end. On a step failure, or once ctx is cancelled (an interruption: no new
// step is taken), it undoes the completed steps after the last pivot in
// reverse and returns an error wrapping ErrCompensated and the cause, or
// ErrLeftOpen if the compensation could not finish.
func (s *Saga) Run(ctx context.Context, j Journal) (err error) {
	if s.ID == "" {
		s.ID = ulid.Make().String()
	}
	ctx, end := s.trace(ctx, "")
	defer func() { end(err) }()
	if len(s.Done) == 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w: %w", s.Kind, ErrNotStarted, context.Cause(ctx))
		}
		names := make([]string, len(s.Steps))
		for i, st := range s.Steps {
			names[i] = st.Name
		}
		if err := s.record(ctx, j, true, string(events.SagaStarted), events.SagaStartedEvent{Kind: s.Kind, Steps: names}); err != nil {
			return fmt.Errorf("%s: %w: %w", s.Kind, ErrNotStarted, err)
		}
		s.hook(string(events.SagaStarted), AfterRecord)
	}
	if s.Forward {
		// Teardown runs to its end once begun; a second signal (which
		// exits the process) leaves it to recover.
		ctx = context.WithoutCancel(ctx)
	}
	pivot := -1
	// held are steps that ran and whose events wait for the next append.
	var held []recorded
	// flush records what is held; it reports the held steps' names with
	// the error.
	flush := func(ctx context.Context) error {
		if len(held) == 0 {
			return nil
		}
		batch := held
		held = nil
		if err := s.recordAll(ctx, j, true, batch...); err != nil {
			return fmt.Errorf("%s: %w", stepNames(batch), err)
		}
		for _, r := range batch {
			if r.pivot {
				pivot = r.index
			}
			s.hook(r.step, AfterRecord)
		}
		return nil
	}
	for i, st := range s.Steps {
		if s.Done[st.Name] {
			if st.Pivot {
				pivot = i
			}
			continue
		}
		if ctx.Err() != nil {
			cause := fmt.Errorf("%s: interrupted before %s: %w", s.Kind, st.Name, context.Cause(ctx))
			if err := flush(ctx); err != nil {
				cause = fmt.Errorf("%w (recording %w)", cause, err)
			}
			return s.compensate(ctx, j, i-1, pivot, cause)
		}
		sctx, endStep := s.trace(ctx, st.Name)
		ps, err := st.Do(sctx)
		if err == nil {
			s.hook(st.Name, BeforeRecord)
			held = append(held, recorded{step: st.Name, index: i, pivot: st.Pivot, ps: ps})
			if st.Defer && !st.Pivot && i < len(s.Steps)-1 {
				endStep(nil)
				continue
			}
			err = flush(sctx)
		} else {
			// What ran before this step took effect: it is journaled
			// before anything is undone.
			if ferr := flush(sctx); ferr != nil {
				err = fmt.Errorf("%w (recording %w)", err, ferr)
			}
			err = fmt.Errorf("%s: %w", st.Name, err)
		}
		endStep(err)
		if err != nil && s.Forward {
			return fmt.Errorf("%w: %s: %w", ErrLeftOpen, s.Kind, err)
		}
		if err != nil {
			return s.compensate(ctx, j, i, pivot, fmt.Errorf("%s: %w", s.Kind, err))
		}
	}
	// Every step took effect and is journaled: the end is a fact, not a
	// decision (and after rm the sandbox has no state left to expect).
	if err := s.record(ctx, j, false, string(events.SagaFinished), events.SagaFinishedEvent{}); err != nil {
		return fmt.Errorf("%s: finish: %w", s.Kind, err)
	}
	return nil
}

func (s *Saga) hook(step string, phase Phase) {
	if s.Hook != nil {
		s.Hook(string(s.Kind), step, phase)
	}
}

// Begin journals saga.started for a saga that will only be compensated
// (recover cleaning up after a runner that died before its own start was
// journaled): every event of a saga must fall inside its start and end.
func (s *Saga) Begin(ctx context.Context, j Journal) error {
	if s.ID == "" {
		s.ID = ulid.Make().String()
	}
	names := make([]string, len(s.Steps))
	for i, st := range s.Steps {
		names[i] = st.Name
	}
	return s.record(ctx, j, false, string(events.SagaStarted), events.SagaStartedEvent{Kind: s.Kind, Steps: names})
}

// Compensate undoes every step (newest first) and closes the saga as
// compensated. Recovery calls it for a saga whose process died.
func (s *Saga) Compensate(ctx context.Context, j Journal, reason string) (err error) {
	ctx, end := s.trace(ctx, "")
	defer func() { end(err) }()
	err = s.compensate(ctx, j, len(s.Steps)-1, -1, errors.New(reason))
	if errors.Is(err, ErrCompensated) {
		return nil
	}
	return err
}

// compensate undoes steps (pivot, failed] newest first; the failed step may
// have done part of its work, so it is undone too. Undo must therefore
// tolerate work that was never done. It runs under a context ctx's
// cancellation does not reach, and it stops at the first step it cannot
// undo or journal: deleting older work while the journal cannot hear of it
// is how files go missing behind the journal's back, so the rest is left
// to recover.
func (s *Saga) compensate(ctx context.Context, j Journal, failed, pivot int, cause error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), orDefault(s.CompensateTimeout, 5*time.Minute))
	defer cancel()
	undone := 0
	for i := failed; i > pivot; i-- {
		st := s.Steps[i]
		if st.Undo == nil {
			continue
		}
		uctx, endUndo := s.trace(cctx, "undo."+st.Name)
		ps, err := st.Undo(uctx)
		if err == nil {
			err = s.record(uctx, j, false, "undo."+st.Name, ps...)
		}
		endUndo(err)
		if err != nil {
			return fmt.Errorf("%w: %w (undo %s: %w; %d step(s) undone before it)", ErrLeftOpen, cause, st.Name, err, undone)
		}
		undone++
	}
	if err := s.record(cctx, j, false, string(events.SagaCompensated), events.SagaCompensatedEvent{Reason: cause.Error()}); err != nil {
		return fmt.Errorf("%w: %w (closing it: %w; %d step(s) undone)", ErrLeftOpen, cause, err, undone)
	}
	return fmt.Errorf("%w (%d step(s) undone and journaled): %w", ErrCompensated, undone, cause)
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// recorded is one step's events, as record journals them.
type recorded struct {
	step  string
	index int  // the step's place in Steps
	pivot bool // the step is a pivot
	ps    []events.Payload
}

// stepNames names the steps of a batch, joined with "+".
func stepNames(batch []recorded) string {
	names := make([]string, len(batch))
	for i, r := range batch {
		names[i] = r.step
	}
	return strings.Join(names, "+")
}

// record journals a step's events. Each gets a step name unique within the
// saga (name, name#2, ...), which is also its de-duplication id.
// A guarded record carries the saga's expectations and advances them.
func (s *Saga) record(ctx context.Context, j Journal, guarded bool, step string, ps ...events.Payload) error {
	return s.recordAll(ctx, j, guarded, recorded{step: step, ps: ps})
}

// recordAll journals the events of several steps in one append.
func (s *Saga) recordAll(ctx context.Context, j Journal, guarded bool, batch ...recorded) error {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	var evs []events.Event
	for _, r := range batch {
		for i, p := range r.ps {
			e := events.New(ulid.Make(), now(), s.Sandbox, p)
			e.Saga, e.Step = s.ID, r.step
			if i > 0 {
				e.Step = fmt.Sprintf("%s#%d", r.step, i+1)
			}
			evs = append(evs, e)
		}
	}
	if len(evs) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), orDefault(s.RecordTimeout, time.Minute))
	defer cancel()
	if !guarded || len(s.Expect) == 0 {
		_, err := j.Append(rctx, evs...)
		return err
	}
	gj, ok := j.(GuardedJournal)
	if !ok {
		return fmt.Errorf("%s: the journal cannot check expectations", s.Kind)
	}
	seqs, err := gj.AppendExpect(rctx, s.Expect, evs...)
	core.Advance(s.Expect, evs, seqs)
	return err
}

// One is a convenience for a step that journals one event.
func One(p events.Payload) []events.Payload { return []events.Payload{p} }
