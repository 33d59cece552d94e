package sagas

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// memJournal folds appended events the way the store does, so the test checks
// what the projections would say.
type memJournal struct {
	evs   []events.Event
	sagas *projections.Sagas
	// appends holds each append's steps, one slice per call.
	appends [][]string
}

func (m *memJournal) Append(_ context.Context, evs ...events.Event) ([]uint64, error) {
	var call []string
	for _, e := range evs {
		call = append(call, e.Step)
	}
	m.appends = append(m.appends, call)
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
	// The hook runs once saga.started is journaled too, before any step.
	if want := []string{"after:saga.started", "a", "before:a", "after:a", "b", "before:b", "after:b"}; !reflect.DeepEqual(order, want) {
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

// guardedJournal is memJournal with per-entity revisions, refusing a stale
// expectation the way the store does; failOn makes appends of one step fail as
// an unreachable journal would.
type guardedJournal struct {
	memJournal
	rev    map[core.Entity]uint64
	failOn string
}

func newGuarded() *guardedJournal {
	return &guardedJournal{memJournal: memJournal{sagas: projections.NewSagas()}, rev: map[core.Entity]uint64{}}
}

func (g *guardedJournal) Append(ctx context.Context, evs ...events.Event) ([]uint64, error) {
	return g.AppendExpect(ctx, nil, evs...)
}

func (g *guardedJournal) AppendExpect(ctx context.Context, expect []core.Expect, evs ...events.Event) ([]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, x := range expect {
		if g.rev[x.Entity] != x.Seq {
			return nil, &core.StaleError{Entity: x.Entity, Expected: x.Seq, Actual: g.rev[x.Entity]}
		}
	}
	for _, e := range evs {
		if g.failOn != "" && e.Step == g.failOn {
			return nil, errors.New("journal unreachable")
		}
	}
	seqs, err := g.memJournal.Append(ctx, evs...)
	for i, e := range evs {
		for _, ent := range core.EntitiesOf(e) {
			g.rev[ent] = seqs[i]
		}
	}
	return seqs, err
}

const sb1 = "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"

func recordingStep(name string, undone *[]string) Step {
	return Step{Name: name,
		Do: func(context.Context) ([]events.Payload, error) {
			return One(events.DiskMaterialisedEvent{Resource: res(name)}), nil
		},
		Undo: func(context.Context) ([]events.Payload, error) {
			*undone = append(*undone, name)
			return One(events.ResourceReclaimedEvent{Resource: res(name), By: "saga"}), nil
		}}
}

func TestFailureAfterPivotKeepsCommittedSteps(t *testing.T) {
	j := newGuarded()
	var undone []string
	commit := recordingStep("commit", &undone)
	commit.Pivot = true
	boom := Step{Name: "vmm", Do: func(context.Context) ([]events.Payload, error) { return nil, errors.New("boot failed") },
		Undo: func(context.Context) ([]events.Payload, error) { undone = append(undone, "vmm"); return nil, nil }}
	s := &Saga{Kind: "create", Sandbox: sb1, Steps: []Step{recordingStep("disk", &undone), commit, recordingStep("supervisor", &undone), boom}}
	if err := s.Run(context.Background(), j); !errors.Is(err, ErrCompensated) {
		t.Fatalf("Run = %v, want compensated", err)
	}
	if want := []string{"vmm", "supervisor"}; !reflect.DeepEqual(undone, want) {
		t.Fatalf("undone %v, want %v: nothing at or before the pivot may be undone", undone, want)
	}
}

func TestInterruptionStopsStepsAndCompensatesUncancelled(t *testing.T) {
	j := newGuarded()
	var undone []string
	ctx, cancel := context.WithCancel(context.Background())
	second := recordingStep("b", &undone)
	do := second.Do
	second.Do = func(c context.Context) ([]events.Payload, error) {
		cancel() // the signal arrives while b runs; b still completes
		return do(c)
	}
	ran := false
	third := Step{Name: "c", Do: func(context.Context) ([]events.Payload, error) { ran = true; return nil, nil }}
	s := &Saga{Kind: "create", Sandbox: sb1, Steps: []Step{recordingStep("a", &undone), second, third}}
	err := s.Run(ctx, j)
	if !errors.Is(err, ErrCompensated) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want compensated after cancellation", err)
	}
	if ran {
		t.Fatal("a step ran after the interruption")
	}
	if want := []string{"b", "a"}; !reflect.DeepEqual(undone, want) {
		t.Fatalf("undone %v, want %v", undone, want)
	}
	want := []string{"saga.started", "a", "b", "undo.b", "undo.a", "saga.compensated"}
	if !reflect.DeepEqual(j.steps(), want) {
		t.Fatalf("journal %v, want %v: every undo journaled despite the cancelled context", j.steps(), want)
	}
}

func TestCompensationStopsWhereTheJournalCannotHear(t *testing.T) {
	j := newGuarded()
	j.failOn = "undo.b"
	var undone []string
	boom := Step{Name: "c", Do: func(context.Context) ([]events.Payload, error) { return nil, errors.New("boom") }}
	s := &Saga{Kind: "create", Sandbox: sb1, Steps: []Step{recordingStep("a", &undone), recordingStep("b", &undone), boom}}
	err := s.Run(context.Background(), j)
	if !errors.Is(err, ErrLeftOpen) {
		t.Fatalf("Run = %v, want left open", err)
	}
	if want := []string{"b"}; !reflect.DeepEqual(undone, want) {
		t.Fatalf("undone %v, want %v: a must not be undone once b's undo could not be journaled", undone, want)
	}
	if len(j.sagas.Open()) != 1 {
		t.Fatal("saga must stay open for recover")
	}
}

func TestStaleDecisionIsRefusedAndStepsAdvanceTheirExpectation(t *testing.T) {
	j := newGuarded()
	ent := core.Sandbox(sb1)
	j.rev[ent] = 7 // the journal moved on after the decision read 5
	var undone []string
	s := &Saga{Kind: "stop", Sandbox: sb1, Steps: []Step{recordingStep("a", &undone)}, Expect: []core.Expect{{Entity: ent, Seq: 5}}}
	err := s.Run(context.Background(), j)
	var stale *core.StaleError
	if !errors.As(err, &stale) || stale.Actual != 7 {
		t.Fatalf("Run = %v, want a stale refusal at 7", err)
	}
	if len(j.evs) != 0 {
		t.Fatal("a stale saga wrote events")
	}
	s = &Saga{Kind: "stop", Sandbox: sb1, Steps: []Step{recordingStep("a", &undone), recordingStep("b", &undone)}, Expect: []core.Expect{{Entity: ent, Seq: 7}}}
	if err := s.Run(context.Background(), j); err != nil {
		t.Fatalf("fresh decision refused: %v", err)
	}
	// The expectation follows the saga's own last forward step (b); the
	// unguarded saga.finished after it is the only later event.
	if s.Expect[0].Seq != j.rev[ent]-1 {
		t.Fatalf("expectation %d, journal at %d", s.Expect[0].Seq, j.rev[ent])
	}
}

func TestForwardSagaIgnoresInterruptionAndStaysOpenOnFailure(t *testing.T) {
	j := newGuarded()
	ctx, cancel := context.WithCancel(context.Background())
	var ran []string
	step := func(name string, err error) Step {
		return Step{Name: name, Do: func(c context.Context) ([]events.Payload, error) {
			if c.Err() != nil {
				return nil, c.Err()
			}
			cancel()
			ran = append(ran, name)
			return One(events.ResourceReclaimedEvent{Resource: res(name), By: "rm"}), err
		}}
	}
	s := &Saga{Kind: "rm", Sandbox: sb1, Forward: true, Steps: []Step{step("a", nil), step("b", nil)}}
	if err := s.Run(ctx, j); err != nil {
		t.Fatalf("interrupted teardown = %v, want it run to its end", err)
	}
	if !reflect.DeepEqual(ran, []string{"a", "b"}) {
		t.Fatalf("ran %v", ran)
	}
	s = &Saga{Kind: "stop", Sandbox: sb1, Forward: true, Steps: []Step{step("x", errors.New("EBUSY")), step("y", nil)}}
	if err := s.Run(context.Background(), j); !errors.Is(err, ErrLeftOpen) {
		t.Fatalf("failed teardown = %v, want left open", err)
	}
	if len(j.sagas.Open()) != 1 {
		t.Fatal("a failed teardown must stay open for recover to finish")
	}
}

// A deferred step's events go in the next step's append; its AfterRecord
// hook waits for that append. A step that fails, or an interruption,
// records what is held before anything is undone.
func TestDeferredStepsShareTheNextAppend(t *testing.T) {
	for _, interrupt := range []bool{false, true} {
		j := &memJournal{sagas: projections.NewSagas()}
		ctx, cancel := context.WithCancel(context.Background())
		var order []string
		step := func(name string, deferred, fail bool) Step {
			return Step{Name: name, Defer: deferred,
				Do: func(context.Context) ([]events.Payload, error) {
					if name == "d" && interrupt {
						cancel()
					}
					if fail {
						return nil, errors.New("boom")
					}
					if name == "b" {
						return nil, nil
					}
					return One(events.DiskMaterialisedEvent{Resource: res(name)}), nil
				},
				Undo: func(context.Context) ([]events.Payload, error) { order = append(order, "undo:"+name); return nil, nil }}
		}
		s := &Saga{Kind: "create", Sandbox: "01JDQ4Z6X1M9A3Y0C5TB2R8NKW",
			Steps: []Step{step("a", true, false), step("b", true, false), step("c", false, false), step("d", true, false), step("e", false, true)},
			Hook:  func(kind, step string, phase Phase) { order = append(order, string(phase)+":"+step) }}
		err := s.Run(ctx, j)
		if !errors.Is(err, ErrCompensated) {
			t.Fatalf("interrupt=%v: %v, want compensated", interrupt, err)
		}
		want := []string{"after:saga.started", "before:a", "before:b", "before:c", "after:a", "after:b", "after:c", "before:d", "after:d"}
		undoFrom := "undo:e"
		if interrupt {
			undoFrom = "undo:d" // e never ran
		}
		for _, u := range []string{"undo:e", "undo:d", "undo:c", "undo:b", "undo:a"} {
			if u == "undo:e" && undoFrom != u {
				continue
			}
			want = append(want, u)
		}
		if !reflect.DeepEqual(order, want) {
			t.Fatalf("interrupt=%v: order\n%v\nwant\n%v", interrupt, order, want)
		}
		wantAppends := [][]string{{"saga.started"}, {"a", "c"}, {"d"}, {"saga.compensated"}}
		if !reflect.DeepEqual(j.appends, wantAppends) {
			t.Fatalf("interrupt=%v: appends %v, want %v", interrupt, j.appends, wantAppends)
		}
	}
}
