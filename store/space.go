package store

import (
	"strings"

	"github.com/nexus-sandbox/nexus/events"
)

// freeingSagas are the saga kinds whose events the journal admits into its
// space reserve: they delete files (rm, snapshot rm, reap) or repair the
// match between journal and disk (recover), and must keep working on a
// nearly full disk.
var freeingSagas = map[events.SagaKind]bool{events.SagaRm: true, events.SagaSnapshotRm: true, events.SagaReap: true, events.SagaRecover: true}

// freeingTypes record space that was, or is about to be, given back. A
// reap dry run's plan (reap.decided) is admitted too: it is how an
// operator sees what --apply --plan would free.
var freeingTypes = map[events.Type]bool{
	events.ReapDecided:       true,
	events.SagaCompensated:   true,
	events.SandboxRemoved:    true,
	events.ResourceReclaimed: true,
	events.ReapApplied:       true,
	events.VolumeRemoved:     true,
	events.ImageCachePruned:  true,
	events.RunSwept:          true,
}

// exitTypes are facts the world imposed (a process exited), not decisions
// that take space: refusing them would leave a dead sandbox shown running.
var exitTypes = map[events.Type]bool{
	events.VMMExited:        true,
	events.SupervisorExited: true,
}

// freesSpace reports whether e may use the journal's space reserve. kind
// is the kind of the saga e belongs to ("" if none or unknown). A
// compensation's events ("undo.<step>") always may: an undo deletes what
// its step made, and a refused undo would leave the saga open.
func freesSpace(e events.Event, kind events.SagaKind) bool {
	return freeingSagas[kind] || freeingTypes[e.Type] || exitTypes[e.Type] || strings.HasPrefix(e.Step, "undo.")
}

// sagaKind is the kind of the saga e belongs to: from e itself when it
// opens the saga, else from the open sagas. Call with n.mu held.
func (n *Store) sagaKind(e events.Event) events.SagaKind {
	if p, ok := e.Payload.(events.SagaStartedEvent); ok {
		return p.Kind
	}
	if e.Saga == "" {
		return ""
	}
	if sg := n.sagas.Get(e.Saga); sg != nil {
		return sg.Kind
	}
	return ""
}
