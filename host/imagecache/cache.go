// Package imagecache owns the bytes of the image cache under images/:
// preparing an entry (clone into a private dir, publish its identity,
// rename into place), scanning committed entries and their sizes, and
// deleting one entry without following a symlink. Which entries may be
// deleted is decided elsewhere, from the journal.
package imagecache

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/layout"
)

// LayoutVersion is the on-disk format of an entry this nexus writes:
// images/<id>/disk.raw plus identity.json.
const LayoutVersion = 1

// ErrDamaged means an entry exists under a cache ID but is not what that ID
// promises (no identity, another identity, no regular root disk).
var ErrDamaged = errors.New("damaged image cache entry")

// Identity is the published identity of an entry, images/<id>/identity.json.
type Identity struct {
	CacheID    string `json:"cache_id"`
	Ref        string `json:"image_ref"`
	Identity   string `json:"identity"`
	Layout     int    `json:"layout_version"`
	PreparedMs int64  `json:"prepared_ms"`
}

// IdentityOf fingerprints the image file at path (absolute): its path and
// the kernel's record of which inode it is and when it last changed. Any
// write to the file moves its ctime, which nobody can set back, so a
// rewritten image gets a new cache entry instead of a stale one. Hashing
// the content instead would read the whole image on every create.
func IdentityOf(path string) (identity, cacheID string, err error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return "", "", fmt.Errorf("image %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", "", fmt.Errorf("image %s: %w", path, disk.ErrNotRegular)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00%d\x00%d.%d\x00%d.%d", path, st.Dev, st.Ino, st.Size,
		st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	sum := hex.EncodeToString(h.Sum(nil))
	return "stat-sha256:" + sum, "img-" + sum[:24], nil
}

// Prepare makes the entry id.CacheID from src unless it is already
// committed. The disk is cloned into a private .prepare-* dir, the
// identity is published there durably (temp, fsync, rename, dir fsync),
// and only then is the dir renamed into place (RENAME_NOREPLACE) and
// images/ fsynced: an entry under its cache ID is always complete. It
// reports whether this call committed the entry; a concurrent preparer
// that committed first wins, and this attempt's copy is discarded.
func Prepare(root layout.Root, src string, id Identity) (committed bool, method disk.Method, err error) {
	return PrepareProgress(root, src, id, nil)
}

// PrepareProgress is Prepare reporting the copy's position to progress.
func PrepareProgress(root layout.Root, src string, id Identity, progress disk.Progress) (committed bool, method disk.Method, err error) {
	committed, method, _, err = PrepareAlso(root, src, id, "", progress)
	return committed, method, err
}

// PrepareAlso is PrepareProgress that, when it has to copy src (the entry
// is not committed yet), also writes the absent file also (a sandbox's OS
// disk) from the same read of src: a cache miss reads the image once. also
// is made only when an entry with id's identity is committed by the time
// PrepareAlso returns (by this call or a concurrent one), so it is a copy
// of that entry; alsoMethod is empty when also was not made (a hit, or ""
// given), and also is removed on every failure.
func PrepareAlso(root layout.Root, src string, id Identity, also string, progress disk.Progress) (committed bool, method, alsoMethod disk.Method, err error) {
	if err := fsx.EnsureDir(string(root), "images"); err != nil {
		return false, "", "", err
	}
	if err := Check(root, id); err == nil {
		return false, "", "", nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, "", "", err
	}
	prep := root.ImagePrepareDir(id.CacheID, ulid.Make().String())
	if err := fsx.Mkdir(string(root), prep, 0o700); err != nil {
		return false, "", "", fmt.Errorf("image cache: %w", err)
	}
	dsts := []string{filepath.Join(prep, layout.ImageDiskName)}
	if also != "" {
		dsts = append(dsts, also)
	}
	made := false
	defer func() {
		if !committed {
			fsx.Remove(string(root), root.Rel(prep))
		}
		if made && err != nil {
			os.Remove(also)
		}
	}()
	methods, err := disk.CloneEach(src, dsts, progress)
	if err != nil {
		return false, "", "", fmt.Errorf("image cache: prepare %s: %w", id.CacheID, err)
	}
	method, made = methods[0], len(methods) > 1
	if made {
		alsoMethod = methods[1]
	}
	// Sandboxes boot on the entry itself, shared and read-only: nothing
	// opens it for writing again, and its mode says so.
	if err := os.Chmod(dsts[0], 0o400); err != nil {
		return false, "", "", fmt.Errorf("image cache: prepare %s: %w", id.CacheID, err)
	}
	committed, err = publish(root, src, id, prep)
	if err != nil {
		return committed, "", "", err
	}
	return committed, method, alsoMethod, nil
}

// publish writes id into the prepared dir prep and renames prep into place
// as the entry, unless a concurrent preparer committed it first.
func publish(root layout.Root, src string, id Identity, prep string) (committed bool, err error) {
	// The identity was taken before the copy; an image rewritten meanwhile
	// would commit content the identity does not describe.
	if now, _, err := IdentityOf(src); err != nil || now != id.Identity {
		return false, fmt.Errorf("image cache: prepare %s: %s changed while it was copied; try again", id.CacheID, src)
	}
	data, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return false, err
	}
	if err := fsx.WriteFile(string(root), filepath.Join(prep, layout.ImageIdentityName), append(data, '\n'), 0o600); err != nil {
		return false, fmt.Errorf("image cache: prepare %s: %w", id.CacheID, err)
	}
	err = unix.Renameat2(unix.AT_FDCWD, prep, unix.AT_FDCWD, root.ImageEntry(id.CacheID), unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return false, Check(root, id)
	}
	if err != nil {
		return false, fmt.Errorf("image cache: commit %s: %w", id.CacheID, err)
	}
	if err := durable.SyncDir(root.Images()); err != nil {
		return true, fmt.Errorf("image cache: commit %s: %w", id.CacheID, err)
	}
	return true, nil
}

// Check verifies that the committed entry id.CacheID holds a regular root
// disk and the identity id.Identity. A missing entry satisfies
// errors.Is(err, os.ErrNotExist).
func Check(root layout.Root, id Identity) error {
	info, err := os.Lstat(root.ImageEntry(id.CacheID))
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("%w: %s is not a directory (a symlink is never followed)", ErrDamaged, root.ImageEntry(id.CacheID))
	}
	if _, err := disk.Stat(root.ImageDisk(id.CacheID)); err != nil {
		return fmt.Errorf("%w: %v", ErrDamaged, err)
	}
	got, err := ReadIdentity(root, id.CacheID)
	if err != nil {
		return fmt.Errorf("%w: %s: %v (prune it with `nexus image-cache prune --unused`)", ErrDamaged, root.ImageEntry(id.CacheID), err)
	}
	if got.Identity != id.Identity {
		return fmt.Errorf("%w: %s has identity %q, want %q", ErrDamaged, root.ImageEntry(id.CacheID), got.Identity, id.Identity)
	}
	return nil
}

// ReadIdentity reads images/<cacheID>/identity.json through fsx: no link
// followed at any level, and a FIFO or device there is an error, not a hang.
func ReadIdentity(root layout.Root, cacheID string) (Identity, error) {
	var id Identity
	if !layout.IsImageEntryName(cacheID) {
		return id, fmt.Errorf("%w: cache id %q", fsx.ErrEscapes, cacheID)
	}
	f, err := fsx.Open(string(root), root.ImageIdentity(cacheID))
	if err != nil {
		return id, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return id, err
	}
	if err := json.Unmarshal(data, &id); err != nil {
		return id, fmt.Errorf("%s: %w", root.ImageIdentity(cacheID), err)
	}
	if id.CacheID != cacheID {
		return id, fmt.Errorf("%s names cache id %q", root.ImageIdentity(cacheID), id.CacheID)
	}
	return id, nil
}
