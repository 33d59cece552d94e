package reaper

import (
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
)

// foldJournal answers the reaper's questions from a projections fold, as
// the store answers them from its indexes.
type foldJournal struct {
	sbs  *projections.Sandboxes
	open map[string]string
}

func foldOf(list []projections.Sandbox, open []projections.OpenSaga) Journal {
	j := foldJournal{sbs: projections.NewSandboxes(), open: map[string]string{}}
	for _, sb := range list {
		j.sbs.Put(&sb)
	}
	for _, sg := range open {
		j.open[sg.Sandbox] = string(sg.Kind)
	}
	return j
}

func (j foldJournal) Owner(rel string) (string, bool) { return j.sbs.PathOwner(rel) }
func (j foldJournal) Sandbox(id string) bool          { return j.sbs.Get(id) != nil }
func (j foldJournal) Handle(h string) (string, bool) {
	handle, ok := layout.HandleOf(h)
	if sb := j.sbs.ByHandle(handle); ok && sb != nil {
		return sb.ID, true
	}
	return "", false
}
func (j foldJournal) OpenSaga(id string) (string, bool) { k, ok := j.open[id]; return k, ok }
