package sagas

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// memJournal folds appended events the way node does, so the test checks
// what the projections would say.
type memJournal struct {
	evs   []events.Event
	sagas *projections.Sagas
}

func (m *memJournal) Append(_ context.Context, evs ...events.Event) ([]uint64, error) {
	var seqs []uint64
	for _, e := range evs {
		if _, err := events.Encode(e); err != nil {
			return seqs, err
		}
		m.evs = append(m.evs, e)
		m.sagas.Apply(uint64(len(m.evs)), e)
		seqs = append(seqs, uint64(len(m.evs)))
	}
	return seqs, nil
}

func (m *memJournal) steps() []string {
	var out []string
	for _, e := range m.evs {
		out = append(out, e.Step)
	}
	return out
}

func res(p string) events.Resource { return events.Resource{Kind: events.KindRawDisk, Path: p} }

func TestRunRecordsStepsInOrder(t *testing.T) {
	j := &memJournal{sagas: projections.NewSagas()}
	var order []string
	s := &Saga{Kind: "create", Sandbox: "01JDQ4Z6X1M9A3Y0C5TB2R8NKW", Steps: []Step{
		{Name: "a", Do: func(context.Context) ([]events.Payload, error) {
			order = append(order, "a")
			return []events.Payload{events.DiskMaterialisedEvent{Resource: res("x")}, events.DiskMaterialisedEvent{Resource: res("y")}}, nil
		}},
		{Name: "b", Do: func(context.Context) ([]events.Payload, error) { order = append(order, "b"); return nil, nil }},
	}, Hook: func(kind, step string, phase Phase) { order = append(order, string(phase)+":"+step) }}
	if err := s.Run(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "before:a", "after:a", "b", "before:b", "after:b"}; !reflect.DeepEqual(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	if want := []string{"saga.started", "a", "a#2", "saga.finished"}; !reflect.DeepEqual(j.steps(), want) {
		t.Fatalf("journaled steps %v, want %v", j.steps(), want)
	}
	ids := map[string]bool{}
	for _, e := range j.evs {
		if ids[e.DedupID()] {
			t.Fatalf("dedup id %s used twice", e.DedupID())
		}
		ids[e.DedupID()] = true
	}
	if len(j.sagas.Open()) != 0 {
		t.Fatal("finished saga still open")
	}
}

func TestFailureUndoesNewestFirst(t *testing.T) {
	j := &memJournal{sagas: projections.NewSagas()}
	var undone []string
	step := func(name string, fail bool) Step {
		return Step{Name: name,
			Do: func(context.Context) ([]events.Payload, error) {
				if fail {
					return nil, errors.New("ENOSPC")
				}
				return One(events.DiskMaterialisedEvent{Resource: res(name)}), nil
			},
			Undo: func(context.Context) ([]events.Payload, error) {
				undone = append(undone, name)
				return One(events.ResourceReclaimedEvent{Resource: res(name), By: "saga"}), nil
			}}
	}
	s := &Saga{Kind: "create", Steps: []Step{step("a", false), step("b", false), step("c", true), step("d", false)}}
	err := s.Run(context.Background(), j)
	if !errors.Is(err, ErrCompensated) || err == nil {
		t.Fatalf("Run = %v, want ErrCompensated", err)
	}
	if want := []string{"c", "b", "a"}; !reflect.DeepEqual(undone, want) {
		t.Fatalf("undo order %v, want %v", undone, want)
	}
	last := j.evs[len(j.evs)-1]
	if last.Type != events.SagaCompensated {
		t.Fatalf("last event %s, want saga.compensated", last.Type)
	}
	if len(j.sagas.Open()) != 0 {
		t.Fatal("compensated saga still open")
	}
}

func TestFailedUndoLeavesSagaOpen(t *testing.T) {
	j := &memJournal{sagas: projections.NewSagas()}
	s := &Saga{Kind: "rm", Steps: []Step{
		{Name: "a", Do: func(context.Context) ([]events.Payload, error) { return nil, nil },
			Undo: func(context.Context) ([]events.Payload, error) { return nil, errors.New("EBUSY") }},
		{Name: "b", Do: func(context.Context) ([]events.Payload, error) { return nil, errors.New("boom") }},
	}}
	if err := s.Run(context.Background(), j); err == nil || errors.Is(err, ErrCompensated) {
		t.Fatalf("Run = %v, want an uncompensated failure", err)
	}
	if len(j.sagas.Open()) != 1 {
		t.Fatal("a saga whose undo failed must stay open for recover")
	}
}

func TestResumeSkipsDoneSteps(t *testing.T) {
	j := &memJournal{sagas: projections.NewSagas()}
	ran := map[string]int{}
	mk := func(name string) Step {
		return Step{Name: name, Do: func(context.Context) ([]events.Payload, error) {
			ran[name]++
			return One(events.DiskMaterialisedEvent{Resource: res(name)}), nil
		}}
	}
	s := &Saga{ID: "s1", Kind: "rm", Steps: []Step{mk("a"), mk("b")}, Done: map[string]bool{"a": true}}
	if err := s.Run(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	if ran["a"] != 0 || ran["b"] != 1 {
		t.Fatalf("ran %v", ran)
	}
	if j.evs[0].Type == events.SagaStarted {
		t.Fatal("a resumed saga journaled saga.started again")
	}
}
