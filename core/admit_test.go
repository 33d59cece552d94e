package core

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

// table is a journal as admission reads it.
type table struct {
	revs    map[Entity]uint64
	open    map[string]bool
	holders map[string]string
}

func (t table) Rev(e Entity) (uint64, error) { return t.revs[e], nil }
func (t table) SagaOpen(id string) bool      { return t.open[id] }
func (t table) Holder(h string) (string, error) {
	return t.holders[h], nil
}

func TestAdmit(t *testing.T) {
	a, b := ulid.Make().String(), ulid.Make().String()
	ev := func(sb, saga string, p events.Payload) events.Event {
		e := events.New(ulid.Make(), time.Unix(1, 0), sb, p)
		e.Saga = saga
		return e
	}
	created := func(sb, h string) events.Event { return ev(sb, "S", events.SandboxCreatedEvent{Handle: h}) }
	claim := func(sb, h string) events.Event { return ev(sb, "S", events.HandleClaimedEvent{Sandbox: sb, Handle: h}) }
	j := table{
		revs:    map[Entity]uint64{Sandbox(a): 7, Handle("d9"): 5},
		open:    map[string]bool{"S": true},
		holders: map[string]string{"d9": a},
	}
	for _, c := range []struct {
		name   string
		expect []Expect
		evs    []events.Event
		n      int
		err    error  // errors.Is target, nil for none
		says   string // the refusal's text names it
	}{
		{name: "fresh expectations", expect: []Expect{{Sandbox(a), 7}, {Handle("d9"), 5}}, evs: []events.Event{ev(a, "S", events.SandboxStoppedEvent{})}, n: 1},
		{name: "stale sandbox", expect: []Expect{{Sandbox(a), 6}}, evs: []events.Event{ev(a, "S", events.SandboxStoppedEvent{})}, err: ErrStale},
		{name: "stale handle: claimed since the decision", expect: []Expect{{Handle("d9"), 4}}, evs: []events.Event{created(b, "d9"), claim(b, "d9")}, err: ErrStale, says: "handle/d9"},
		{name: "held by another live sandbox", expect: []Expect{{Handle("d9"), 5}}, evs: []events.Event{ev(b, "S", events.SagaStartedEvent{}), created(b, "d9"), claim(b, "d9")}, n: 1, err: ErrRefused, says: "held by sandbox " + a},
		{name: "a fork child named with a held handle", evs: []events.Event{ev(b, "S", events.SandboxForkedEvent{Parent: a, Handle: "d9"})}, err: ErrRefused, says: a},
		{name: "a restore named with a held handle", evs: []events.Event{ev(b, "S", events.SandboxRestoredEvent{Handle: "d9"})}, err: ErrRefused, says: a},
		{name: "its own holder again (a retry)", evs: []events.Event{created(a, "d9"), claim(a, "d9")}, n: 2},
		{name: "a free handle", evs: []events.Event{created(b, "web"), claim(b, "web")}, n: 2},
		{name: "two claims of one handle in one append", evs: []events.Event{created(b, "web"), claim(b, "web"), created(ulid.Make().String(), "web")}, n: 2, err: ErrRefused, says: "held by sandbox " + b},
		{name: "a claim on its own", evs: []events.Event{claim(b, "web")}, err: ErrRefused, says: "must follow"},
		{name: "a claim of another handle", evs: []events.Event{created(b, "web"), claim(b, "www")}, n: 1, err: ErrRefused, says: "must follow"},
		{name: "a closed saga", evs: []events.Event{ev(a, "T", events.SandboxStoppedEvent{})}, err: ErrSagaClosed},
		{name: "a saga the append starts and closes", evs: []events.Event{ev(b, "U", events.SagaStartedEvent{}), ev(b, "U", events.SagaCompensatedEvent{}), ev(b, "U", events.SandboxStoppedEvent{})}, n: 2, err: ErrSagaClosed},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, err := Admit(j, c.expect, c.evs)
			if n != c.n || !errors.Is(err, c.err) || c.err == nil && err != nil {
				t.Fatalf("Admit = %d, %v; want %d, %v", n, err, c.n, c.err)
			}
			if c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says)) {
				t.Fatalf("refusal %v does not say %q", err, c.says)
			}
		})
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub))
}
