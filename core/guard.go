// The guard on every transition: a decision names the entities its events
// concern and the sequence it saw for each (Expect); the store checks the
// Expects under its append lock (Admit) and the journal checks them again
// (Nats-Expected-Last-Subject-Sequence over the entity's subjects); the
// runner lease (host/sagalease) keeps a second runner off the entity while
// a saga is open.

package core

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nexus-sandbox/nexus/events"
)

// Entity names something decisions are taken about: "sandbox/<ULID>",
// "volume/<name>", "handle/<handle>", or "reap" (the one reap run at a
// time).
type Entity string

// Sandbox is the entity of a sandbox.
func Sandbox(id string) Entity { return Entity("sandbox/" + id) }

// Volume is the entity of a named volume.
func Volume(name string) Entity { return Entity("volume/" + name) }

// Handle is the entity of a sandbox handle: at most one live sandbox
// holds it.
func Handle(handle string) Entity { return Entity("handle/" + handle) }

// Reap is the entity every reap --apply run claims.
const Reap Entity = "reap"

// Kind is the part before the slash ("sandbox", "volume", "handle", "reap").
func (e Entity) Kind() string { k, _, _ := strings.Cut(string(e), "/"); return k }

// Name is the part after the slash (a sandbox id, a volume name, a handle).
func (e Entity) Name() string { _, n, _ := strings.Cut(string(e), "/"); return n }

// Expect says: admit this append only if the last event about Entity is
// still the one at Seq (0: no event about it yet).
type Expect struct {
	Entity Entity `json:"entity"`
	Seq    uint64 `json:"seq"`
}

// EntitiesOf lists the entities an event concerns: its sandbox, the volume
// a volume event names, and the handle an event gives its sandbox or
// claims. It is the one statement of it: admission, expectations and the
// store's group commit all read it.
func EntitiesOf(e events.Event) []Entity {
	var out []Entity
	if e.Sandbox != "" {
		out = append(out, Sandbox(e.Sandbox))
	}
	if h := events.HandleOf(e); h != "" {
		out = append(out, Handle(h))
	}
	switch p := e.Payload.(type) {
	case events.HandleClaimedEvent:
		out = append(out, Handle(p.Handle))
	case events.VolumeCreatedEvent:
		out = append(out, Volume(p.Name))
	case events.VolumeAttachedEvent:
		out = append(out, Volume(p.Name))
	case events.VolumeDetachedEvent:
		out = append(out, Volume(p.Name))
	case events.VolumeRemovedEvent:
		out = append(out, Volume(p.Name))
	}
	return out
}

// Advance moves each expectation an appended event concerns to that
// event's sequence: a saga's next step expects exactly what it last wrote.
func Advance(expect []Expect, evs []events.Event, seqs []uint64) {
	for i, e := range evs {
		if i >= len(seqs) {
			return
		}
		for _, ent := range EntitiesOf(e) {
			for j := range expect {
				if expect[j].Entity == ent {
					expect[j].Seq = seqs[i]
				}
			}
		}
	}
}

// ErrStale marks an append refused because its decision was taken on state
// the journal has since moved past.
var ErrStale = errors.New("decided on stale state")

// ErrSagaClosed marks an event for a saga the journal has already closed.
var ErrSagaClosed = errors.New("saga already closed")

// StaleError says which entity moved and to what.
type StaleError struct {
	Entity   Entity `json:"entity"`
	Expected uint64 `json:"expected"`
	Actual   uint64 `json:"actual"`
	// Latest is the type of the event at Actual, when known.
	Latest events.Type `json:"latest,omitempty"`
}

func (e *StaleError) Error() string {
	what := ""
	if e.Latest != "" {
		what = fmt.Sprintf(" (%s)", e.Latest)
	}
	return fmt.Sprintf("%s changed while this command decided: it was at event %d, the journal is at %d%s", e.Entity, e.Expected, e.Actual, what)
}

func (e *StaleError) Unwrap() error { return ErrStale }
