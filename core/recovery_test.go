package core

import (
	"fmt"
	"slices"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestRecovery runs testdata/recovery.txt: each case is an open saga's
// kind and the evidence recover gathered, and the decision expected.
//
//	recover kind=<saga kind> [creator-alive] [sandbox=<state>] [snapshot=<id>] [volume=<name>]
//
// sandbox= says the journal has the saga's sandbox, in that state; without
// it the sandbox is not in the journal.
func TestRecovery(t *testing.T) {
	var decided []RecoveryDecision
	cases := runCases(t, "testdata/recovery.txt", func(t *testing.T, c testCase) string {
		if c.cmd != "recover" {
			t.Fatalf("%s: unknown command %q", c.pos, c.cmd)
		}
		c.only(t, "kind", "creator-alive", "sandbox", "snapshot", "volume")
		kind, ok := c.arg("kind")
		if !ok {
			t.Fatalf("%s: no kind=", c.pos)
		}
		var ev RecoveryEvidence
		_, ev.CreatorAlive = c.arg("creator-alive")
		if st, ok := c.arg("sandbox"); ok {
			ev.Found, ev.State = true, projections.State(st)
		}
		ev.Snapshot, _ = c.arg("snapshot")
		ev.Volume, _ = c.arg("volume")
		d := Recovery(projections.OpenSaga{ID: "saga", Kind: events.SagaKind(kind), Sandbox: "sb"}, ev)
		decided = append(decided, d)
		out := fmt.Sprintf("%s %s", d.Action, d.Plan)
		if d.Reason != "" {
			out += fmt.Sprintf(" %q", d.Reason)
		}
		return out
	})
	// The file covers every saga kind, every action and every plan.
	kinds := []events.SagaKind{events.SagaCreate, events.SagaFork, events.SagaRestore, events.SagaSnapshot,
		events.SagaStart, events.SagaStop, events.SagaRm, events.SagaRecover, events.SagaReap, events.SagaVolumeRm,
		events.SagaSnapshotRm}
	for _, k := range kinds {
		if !slices.ContainsFunc(cases, func(c testCase) bool { return c.args["kind"] == string(k) }) {
			t.Errorf("testdata/recovery.txt has no case of a %s saga", k)
		}
	}
	for _, a := range []RecoveryAction{Leave, Resume, Compensate} {
		if !slices.ContainsFunc(decided, func(d RecoveryDecision) bool { return d.Action == a }) {
			t.Errorf("testdata/recovery.txt has no case that decides %s", a)
		}
	}
	for _, p := range []RecoveryPlan{PlanClose, PlanFinishCommitted, PlanUndoUncommitted, PlanRemove, PlanStop,
		PlanUndoStart, PlanDropCapture, PlanDeleteSnapshot, PlanDeleteVolume} {
		if !slices.ContainsFunc(decided, func(d RecoveryDecision) bool { return d.Plan == p }) {
			t.Errorf("testdata/recovery.txt has no case whose plan is %s", p)
		}
	}
	if len(decided) != len(cases) {
		t.Fatalf("%d cases decided %d times", len(cases), len(decided))
	}
}
