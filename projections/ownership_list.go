package projections

import (
	"sort"

	"github.com/nexus-sandbox/nexus/events"
)

// OwnedPath is one entry of the ownership index, for listing.
type OwnedPath struct {
	Path    string              `json:"path"`
	Sandbox string              `json:"sandbox"`
	Kind    events.ResourceKind `json:"kind"`
}

// Owned lists every path the view gives to a sandbox (by PathOwner's
// exact lookup: the first owner in List order), sorted by path.
func (s *Sandboxes) Owned() []OwnedPath {
	out := make([]OwnedPath, 0, len(s.owners.one))
	for p := range s.owners.one {
		id, _ := s.owners.least(p, "")
		kind := events.ResourceKind("")
		for _, r := range s.byID[id].Resources {
			if r.Path == p {
				kind = r.Kind
				break
			}
		}
		out = append(out, OwnedPath{Path: p, Sandbox: id, Kind: kind})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
