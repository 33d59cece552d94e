package core

import (
	"errors"
	"fmt"

	"github.com/nexus-sandbox/nexus/events"
)

// Journal is what admission reads of the journal as it stands before an
// append: the store's views, or a test's in-memory journal.
type Journal interface {
	// Rev is the sequence of the last event about entity (0: none); for a
	// handle, of its last handle.claimed; for a volume that no longer
	// exists, of the last event on its own subject (events.VolumeSubjects),
	// which a new volume of the name expects.
	Rev(Entity) (uint64, error)
	// SagaOpen says whether the journal shows saga id open.
	SagaOpen(id string) bool
	// Holder is the live (not removed) sandbox holding handle, or "".
	Holder(handle string) (string, error)
}

// HandleHeld refuses a sandbox a handle another live sandbox holds.
type HandleHeld struct {
	Handle string
	Holder string // the sandbox holding it
	// Sandbox is the one refused.
	Sandbox string
}

func (e *HandleHeld) Error() string {
	return fmt.Sprintf("handle %q is held by sandbox %s", e.Handle, e.Holder)
}

func (e *HandleHeld) Unwrap() error { return ErrRefused }

// Is makes every HandleHeld an ErrHandleTaken.
func (e *HandleHeld) Is(target error) bool { return target == ErrHandleTaken }

// ErrHandleTaken marks every refusal of a handle another live sandbox
// holds, wherever it was found (a command's decision, or admission): callers
// branch on it with errors.Is. Such a refusal is also ErrRefused.
var ErrHandleTaken = errors.New("handle taken")

// Admit decides whether evs may be appended, in order, by a writer whose
// decision saw expect. It is the one admission rule: the store applies it
// under its append lock, and a test's in-memory journal applies it too.
//
// A stale expectation refuses every event (a *StaleError naming the first
// entity that moved, n = 0). Otherwise the events are admitted up to the
// first one refused, and n counts those before it:
//   - an event of a saga the journal does not show open (ErrSagaClosed):
//     once a saga is finished or compensated nothing more is written in
//     its name;
//   - an event giving a sandbox a handle another live sandbox holds
//     (*HandleHeld, naming the holder);
//   - a handle.claimed that does not follow the event giving its sandbox
//     that handle: the pair goes into the journal as one batch, so that
//     the journal checks the handle's subject too (a writer that decided
//     on the handle's state appends both; lifecycle always does).
//
// What evs do themselves counts for the events after them: a saga they
// start or close, a handle they give.
func Admit(j Journal, expect []Expect, evs []events.Event) (int, error) {
	for _, x := range expect {
		cur, err := j.Rev(x.Entity)
		if err != nil {
			return 0, err
		}
		if cur != x.Seq {
			return 0, &StaleError{Entity: x.Entity, Expected: x.Seq, Actual: cur}
		}
	}
	open := map[string]bool{}    // sagas evs start or close
	given := map[string]string{} // handle → sandbox, given by evs
	for i, e := range evs {
		if e.Saga != "" && e.Type != events.SagaStarted {
			isOpen, known := open[e.Saga]
			if !known {
				isOpen = j.SagaOpen(e.Saga)
			}
			if !isOpen {
				return i, fmt.Errorf("%w: %s of saga %s is not open in the journal", ErrSagaClosed, e.Type, e.Saga)
			}
		}
		switch e.Type {
		case events.SagaStarted:
			open[e.Saga] = true
		case events.SagaFinished, events.SagaCompensated:
			open[e.Saga] = false
		}
		if h := events.HandleOf(e); h != "" {
			holder, ok := given[h]
			if !ok {
				var err error
				if holder, err = j.Holder(h); err != nil {
					return i, err
				}
			}
			if holder != "" && holder != e.Sandbox {
				return i, &HandleHeld{Handle: h, Holder: holder, Sandbox: e.Sandbox}
			}
			given[h] = e.Sandbox
		}
		if _, ok := e.Payload.(events.HandleClaimedEvent); ok {
			if i == 0 || !Claimed(evs, i-1) {
				return i, fmt.Errorf("%w: a handle.claimed must follow the event giving its sandbox that handle", ErrRefused)
			}
		}
	}
	return len(evs), nil
}

// Claimed says whether evs[i] gives a handle and evs[i+1] claims it: the
// two events the journal takes as one batch.
func Claimed(evs []events.Event, i int) bool {
	h := events.HandleOf(evs[i])
	if h == "" || i+1 >= len(evs) {
		return false
	}
	p, ok := evs[i+1].Payload.(events.HandleClaimedEvent)
	return ok && p.Sandbox == evs[i].Sandbox && p.Handle == h
}
