package projections

import (
	"path"
	"slices"
	"strings"

	"github.com/nexus-sandbox/nexus/events"
)

// PathOwner is the ownership rule for a path found under the state root:
// it is the sandbox's whose resources include the path itself, a path
// below it (a directory holding an owned path, other than one of the
// root's top-level directories, which every sandbox has paths under), or
// a directory above it.
// An index answers it through two lookups, each a point lookup: exact(p)
// is a sandbox owning exactly p, below(dir) one owning a path under dir.
// The store, the reaper and replay all ask it, so a path has one owner
// whoever asks.
func PathOwner(rel string, exact, below func(string) (string, bool, error)) (string, bool, error) {
	p := path.Clean(rel)
	if id, ok, err := exact(p); err != nil || ok {
		return id, ok, err
	}
	if nested(p) {
		if id, ok, err := below(p); err != nil || ok {
			return id, ok, err
		}
	}
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if id, ok, err := exact(d); err != nil || ok {
			return id, ok, err
		}
	}
	return "", false, nil
}

// nested says p is below one of the root's top-level directories.
func nested(p string) bool { return strings.Contains(strings.TrimPrefix(p, "/"), "/") }

// ownedDirs are the nested directories holding a path of rs, each once:
// what below answers from.
func ownedDirs(rs []events.Resource) []string {
	var out []string
	for _, r := range rs {
		p := path.Clean(r.Path)
		for d := path.Dir(p); d != "." && d != "/" && nested(d); d = path.Dir(d) {
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
		}
	}
	return out
}
