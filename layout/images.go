package layout

import (
	"fmt"
	"path/filepath"
	"strings"
)

// The image cache (SPEC: images/). A committed entry is a directory
// images/<cacheID>/ holding the prepared root disk and the identity it was
// prepared from; everything whose name starts with "." is bookkeeping
// (the lease, preparation and pruning work dirs) and never an entry.
const (
	// ImageDiskName is the committed root disk inside an entry.
	ImageDiskName = "disk.raw"
	// ImageIdentityName is the identity file, published atomically inside
	// the preparation dir before the entry is renamed into place.
	ImageIdentityName = "identity.json"
	// ImageLeaseName is the cache lease: shared by creates and preparation,
	// exclusive for a real prune.
	ImageLeaseName = ".lease"
	// imagePreparePrefix names an in-progress preparation directory.
	imagePreparePrefix = ".prepare-"
	// imagePrunePrefix names an entry being deleted by prune.
	imagePrunePrefix = ".pruning-"
	// ImageTemplateSuffix marks an overlay template directory: out of the
	// cache command's scope, never listed or deleted.
	ImageTemplateSuffix = ".template"
)

func (r Root) ImageEntry(cacheID string) string { return r.join("images", cacheID) }
func (r Root) ImageDisk(cacheID string) string  { return r.join("images", cacheID, ImageDiskName) }
func (r Root) ImageIdentity(cacheID string) string {
	return r.join("images", cacheID, ImageIdentityName)
}
func (r Root) ImageLease() string { return r.join("images", ImageLeaseName) }

// ImagePrepareDir is a private preparation directory for one attempt.
func (r Root) ImagePrepareDir(cacheID, attempt string) string {
	return r.join("images", imagePreparePrefix+cacheID+"-"+attempt)
}

// ImagePruneDir is where prune moves an entry before deleting it, so a
// half-deleted tree never sits under a cache ID.
func (r Root) ImagePruneDir(cacheID, attempt string) string {
	return r.join("images", imagePrunePrefix+cacheID+"-"+attempt)
}

// IsPruneLeftover reports whether name (under images/) is a pruning work
// dir an interrupted prune left behind.
func IsPruneLeftover(name string) bool { return strings.HasPrefix(name, imagePrunePrefix) }

// IsImageEntryName reports whether name (under images/) may be a cache
// entry: a plain name that is not bookkeeping, not an overlay template,
// and cannot climb out of images/.
func IsImageEntryName(name string) bool {
	if name == "" || name == ".." || strings.HasPrefix(name, ".") || strings.HasSuffix(name, ImageTemplateSuffix) {
		return false
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok {
			return false
		}
	}
	return true
}

// OverlayTemplate is the directory of the empty ext4 template a new
// sandbox's empty workspace (overlay) disk of sizeBytes is cloned from:
// one per size, made once (host/imagecache.Template).
func (r Root) OverlayTemplate(sizeBytes int64) string {
	return r.join("images", fmt.Sprintf("ext4-%d%s", sizeBytes, ImageTemplateSuffix))
}

// OverlayTemplateDisk is the template's image inside OverlayTemplate.
func (r Root) OverlayTemplateDisk(sizeBytes int64) string {
	return filepath.Join(r.OverlayTemplate(sizeBytes), ImageDiskName)
}
