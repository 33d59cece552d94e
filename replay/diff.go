package replay

import (
	"sort"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// Divergence is where the journal and the state root disagree.
type Divergence struct {
	// Untracked are paths on disk that no event attributes to a sandbox.
	Untracked []string `json:"untracked"`
	// Missing are resources the journal says a sandbox owns that are gone.
	Missing []Missing `json:"missing"`
	// OpenSagas were started and neither finished nor compensated.
	OpenSagas []*projections.OpenSaga `json:"open_sagas"`
	// ReapedOwned are deletions by a reap of paths the journal attributed
	// to a sandbox at that moment: the reaper broke its promise.
	ReapedOwned []ReapedOwned `json:"reaped_owned"`
}

// Missing is an owned resource that is not on disk.
type Missing struct {
	Sandbox string              `json:"sandbox"`
	Kind    events.ResourceKind `json:"kind"`
	Path    string              `json:"path"`
}

// ReapedOwned is one such deletion.
type ReapedOwned struct {
	Seq   uint64 `json:"seq"`
	Path  string `json:"path"`
	Owner string `json:"owner"`
}

// Empty reports a state root that matches its journal.
func (d Divergence) Empty() bool {
	return len(d.Untracked) == 0 && len(d.Missing) == 0 && len(d.OpenSagas) == 0 && len(d.ReapedOwned) == 0
}

// Diff compares the journal with the state root as the caller observed it:
// onDisk lists the reapable entries found (paths relative to the root, as
// events record them), present says whether an owned resource's path
// exists. It is pure; the caller does the scanning.
func Diff(records []Record, onDisk []string, present func(rel string) bool) (Divergence, error) {
	evs, err := decodeAll(records)
	if err != nil {
		return Divergence{}, err
	}
	d := Divergence{Untracked: []string{}, Missing: []Missing{}, ReapedOwned: []ReapedOwned{}}
	sbs, sagas := projections.NewSandboxes(), projections.NewSagas()
	for _, e := range evs {
		// Judge a reap's deletions against ownership as it stood just
		// before the reap recorded them.
		for _, path := range reapDeletions(e.ev) {
			if owner, ok := sbs.PathOwner(path); ok {
				d.ReapedOwned = append(d.ReapedOwned, ReapedOwned{Seq: e.seq, Path: path, Owner: owner})
			}
		}
		sbs.Apply(e.seq, e.ev)
		sagas.Apply(e.seq, e.ev)
	}
	for _, rel := range onDisk {
		if _, ok := sbs.PathOwner(rel); !ok {
			d.Untracked = append(d.Untracked, rel)
		}
	}
	for _, sb := range sbs.List() {
		for _, r := range sb.Resources {
			if !present(r.Path) {
				d.Missing = append(d.Missing, Missing{Sandbox: sb.ID, Kind: r.Kind, Path: r.Path})
			}
		}
	}
	sort.Strings(d.Untracked)
	d.OpenSagas = sagas.Open()
	return d, nil
}

func reapDeletions(e events.Event) []string {
	switch p := e.Payload.(type) {
	case events.ReapAppliedEvent:
		out := make([]string, 0, len(p.Deleted))
		for _, en := range p.Deleted {
			out = append(out, en.Path)
		}
		return out
	case events.ResourceReclaimedEvent:
		if p.By == "reap" {
			return []string{p.Resource.Path}
		}
	}
	return nil
}
