package layout

import (
	"path/filepath"
	"strings"
)

// CoveredBy reports whether rel, a path relative to the state root that an
// intent of sandbox id (created with handle, "" for none) says it covers,
// is a path that create, fork or restore of that sandbox can make. Recovery
// deletes what an uncommitted intent covers, so an intent is trusted only
// for its own sandbox's names: a damaged or planted marker naming a volume,
// the journal, another sandbox's disk or anything outside the root covers
// nothing.
func CoveredBy(rel, id, handle string) bool {
	if rel == "" || filepath.IsAbs(rel) || filepath.Clean(rel) != rel || !IsULID(id) {
		return false
	}
	dir, base := filepath.Split(rel)
	switch dir {
	case "supervisors/", "sandboxes/", "snapshots/", "builder-supervisors/":
		return base == id
	case "disks/":
	default:
		return false
	}
	if base == id+".raw" || base == id+"-workspace.ext4" {
		return true
	}
	// A fork or restore child's copy of a parent's shadow disk: the child
	// owns it though its name carries the parent's handle.
	if rest, ok := strings.CutPrefix(base, id+"-"); ok && isShadowFile(rest) {
		return true
	}
	// The handle-keyed shadow disk of a create with a handle, written
	// before the sandbox has a record.
	if handle != "" {
		if rest, ok := strings.CutPrefix(base, SafeHandle(handle)+".shadow."); ok {
			return validShadowName(strings.TrimSuffix(rest, ".ext4")) && strings.HasSuffix(rest, ".ext4")
		}
	}
	return false
}

// isShadowFile matches <parentSafeHandle>.shadow.<name>.ext4.
func isShadowFile(s string) bool {
	i := strings.LastIndex(s, ".shadow.")
	if i <= 0 || !strings.HasSuffix(s, ".ext4") {
		return false
	}
	return validShadowName(strings.TrimSuffix(s[i+len(".shadow."):], ".ext4"))
}

func validShadowName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/\x00") && name != "." && name != ".."
}
