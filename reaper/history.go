package reaper

import (
	"sort"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// Supervisors folds supervisor.started/stopped events into the identities
// the journal recorded and never saw stop, per sandbox. Unlike the
// Sandboxes projection it keeps them after the sandbox is removed: a
// detached supervisor that outlived its sandbox is an orphan only this
// record can name.
type Supervisors struct {
	running map[string][]projections.Process
}

// NewSupervisors returns an empty fold.
func NewSupervisors() *Supervisors { return &Supervisors{running: map[string][]projections.Process{}} }

// Apply folds one event; events of other types are ignored.
func (s *Supervisors) Apply(e events.Event) {
	if e.Sandbox == "" {
		return
	}
	switch p := e.Payload.(type) {
	case events.SupervisorStartedEvent:
		s.running[e.Sandbox] = append(s.running[e.Sandbox], projections.Process{Pid: p.Pid, StartTicks: p.Start})
	case events.SupervisorStoppedEvent:
		kept := s.running[e.Sandbox][:0]
		for _, pr := range s.running[e.Sandbox] {
			if pr.Pid != p.Pid {
				kept = append(kept, pr)
			}
		}
		if len(kept) == 0 {
			delete(s.running, e.Sandbox)
		} else {
			s.running[e.Sandbox] = kept
		}
	}
}

// Recorded is one supervisor identity the journal still considers running.
type Recorded struct {
	Sandbox string
	projections.Process
}

// Gone lists the supervisors recorded running for sandboxes the journal no
// longer knows: the candidates for killing as orphans.
func (s *Supervisors) Gone(j Journal) []Recorded {
	var out []Recorded
	for id, list := range s.running {
		if j != nil && j.Sandbox(id) {
			continue // recover judges the supervisors of existing sandboxes
		}
		for _, p := range list {
			out = append(out, Recorded{Sandbox: id, Process: p})
		}
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Pid < out[k].Pid })
	return out
}
