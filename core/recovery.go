package core

import (
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// RecoveryAction is what recover does with an open saga.
type RecoveryAction string

const (
	// Leave the saga to the process still running it.
	Leave RecoveryAction = "leave"
	// Resume runs the saga forward to its end.
	Resume RecoveryAction = "resume"
	// Compensate undoes what the saga did and closes it as compensated.
	Compensate RecoveryAction = "compensate"
)

// RecoveryPlan names the steps the edge builds to carry out a decision.
type RecoveryPlan string

const (
	// PlanClose runs no step: only the saga's end is journaled.
	PlanClose RecoveryPlan = "close"
	// PlanFinishCommitted finishes a committed create, fork or restore:
	// its leftover intents retired, and a VMM or supervisor the journal
	// never recorded stopped (the sandbox is left stopped).
	PlanFinishCommitted RecoveryPlan = "finish-committed"
	// PlanUndoUncommitted stops what an uncommitted create, fork or
	// restore spawned and deletes what it made or its intents cover.
	PlanUndoUncommitted RecoveryPlan = "undo-uncommitted"
	// PlanRemove runs rm's steps on the sandbox.
	PlanRemove RecoveryPlan = "remove"
	// PlanStop runs stop's steps on the sandbox.
	PlanStop RecoveryPlan = "stop"
	// PlanUndoStart drops an overlay recovery's private copy and stops a
	// VMM and supervisor a start spawned before recording them.
	PlanUndoStart RecoveryPlan = "undo-start"
	// PlanDropCapture deletes snapshot directories no event recorded.
	PlanDropCapture RecoveryPlan = "drop-capture"
	// PlanDeleteSnapshot finishes deleting the snapshot the saga names.
	PlanDeleteSnapshot RecoveryPlan = "delete-snapshot"
	// PlanDeleteVolume finishes deleting the volume the saga names.
	PlanDeleteVolume RecoveryPlan = "delete-volume"
)

// RecoveryEvidence is what recover gathered about one open saga while
// holding its runner lease.
type RecoveryEvidence struct {
	// CreatorAlive: the create intent of the saga's sandbox is leased by
	// a live process, or its lease could not be probed (ambiguity is
	// taken as alive).
	CreatorAlive bool
	// Found: the journal has the saga's sandbox, in State.
	Found bool
	State projections.State
	// Snapshot is the snapshot a snapshot-rm saga's step names ("" if
	// none, or not a snapshot ID).
	Snapshot string
	// Volume is the volume a volume-rm saga's step names ("" if none, or
	// not a valid volume name).
	Volume string
}

// RecoveryDecision is what recover does with one open saga, and why.
type RecoveryDecision struct {
	Action RecoveryAction
	Plan   RecoveryPlan
	// Reason says why: journaled with a compensation.
	Reason string
}

func leave(reason string) RecoveryDecision {
	return RecoveryDecision{Action: Leave, Plan: PlanClose, Reason: reason}
}

func resume(p RecoveryPlan) RecoveryDecision { return RecoveryDecision{Action: Resume, Plan: p} }

func compensate(p RecoveryPlan, reason string) RecoveryDecision {
	return RecoveryDecision{Action: Compensate, Plan: p, Reason: reason}
}

// Recovery decides what recover does with an open saga whose runner lease
// it holds: an interrupted flow is finished forward where it committed or
// only takes things down, and undone where it did not commit.
func Recovery(sg projections.OpenSaga, ev RecoveryEvidence) RecoveryDecision {
	switch k := sg.Kind; {
	case k.CreatesSandbox():
		if ev.CreatorAlive {
			return leave("its creator still holds its create intent")
		}
		if ev.Found && ev.State != projections.StateCreating {
			// Committed: what remains is bookkeeping. The sandbox is
			// left stopped; the user starts it again.
			return resume(PlanFinishCommitted)
		}
		return compensate(PlanUndoUncommitted, "creator died before commit")
	case k == events.SagaRm:
		if !ev.Found {
			return resume(PlanClose) // removed already; only the saga's end is missing
		}
		return resume(PlanRemove)
	case k == events.SagaStop:
		if !ev.Found {
			return resume(PlanClose)
		}
		return resume(PlanStop)
	case k == events.SagaStart:
		if !ev.Found || ev.State == projections.StateRunning {
			return resume(PlanClose)
		}
		return compensate(PlanUndoStart, "starter died before the VMM was recorded")
	case k == events.SagaSnapshot:
		// The snapshot never got its event: drop the partial directory.
		return compensate(PlanDropCapture, "snapshot interrupted")
	case k == events.SagaSnapshotRm:
		// The directory may be half deleted: finish it, then the event.
		if ev.Snapshot != "" && ev.Found {
			return resume(PlanDeleteSnapshot)
		}
		return resume(PlanClose) // its sandbox is gone, and rm deleted the snapshot with it
	case k == events.SagaVolumeRm:
		// The files may be half deleted: finish the delete, then the event.
		if ev.Volume != "" {
			return resume(PlanDeleteVolume)
		}
		return compensate(PlanClose, "volume-rm saga names no volume")
	case k == events.SagaReap:
		// Deleting orphans is idempotent and the next reap re-derives its
		// plan from the disk and the journal: close the interrupted run.
		return compensate(PlanClose, "reap interrupted; the next reap judges again")
	default:
		return compensate(PlanClose, "unknown saga kind "+string(k))
	}
}
