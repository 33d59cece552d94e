package projections

import (
	"sort"

	"github.com/nexus-sandbox/nexus/events"
)

// OwnedPath is one entry of the ownership view, for listing.
type OwnedPath struct {
	Path    string              `json:"path"`
	Sandbox string              `json:"sandbox"`
	Kind    events.ResourceKind `json:"kind"`
}

// List returns every owned path with its owner, sorted by path.
func (o *Ownership) List() []OwnedPath {
	out := make([]OwnedPath, 0, len(o.byPath))
	for p, r := range o.byPath {
		out = append(out, OwnedPath{Path: p, Sandbox: r.sandbox.String(), Kind: o.kinds[r.kind]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
