// Package ext4test builds the damaged and full ext4 images the overlay
// tests need, with the real e2fsprogs tools and no mount: files are written
// with debugfs, a dirty journal with debugfs's journal commands, corruption
// by editing the superblock bytes.
package ext4test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/host/ext4"
)

// Make creates an ext4 image of sizeBytes at path.
func Make(t testing.TB, path string, sizeBytes int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(sizeBytes)
	f.Close()
	tool(t, "mkfs.ext4", "-q", "-F", path)
}

// Debugfs runs debugfs -w with the given request lines and fails the test
// when debugfs reports an error on any of them.
func Debugfs(t testing.TB, image string, requests ...string) string {
	t.Helper()
	path, err := ext4.Lookup("debugfs")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, "-w", "-f", "-", image)
	cmd.Stdin = strings.NewReader(strings.Join(requests, "\n") + "\n")
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs %v on %s: %v\n%s", requests, image, err, out)
	}
	for _, bad := range []string{"Could not allocate", "No free space", "ext2_file_write", "write_file:"} {
		if bytes.Contains(out, []byte(bad)) {
			t.Fatalf("debugfs %v on %s: %s", requests, image, out)
		}
	}
	return string(out)
}

// Write stores data as /name in the image.
func Write(t testing.TB, image, name string, data []byte) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	Debugfs(t, image, "write "+src+" "+name)
}

// Fill writes /name, a file of non-zero bytes, sized to take every block
// an unprivileged writer could still allocate, less a few for the file's
// own extent tree: afterwards the checked usable space is (near) zero, what
// a guest sees as "No space left on device". It returns the file's size.
func Fill(t testing.TB, image, name string) int64 {
	t.Helper()
	c, err := ext4.CheckImage(context.Background(), image)
	if err != nil {
		t.Fatal(err)
	}
	size := c.UsableBytes() - 64*c.BlockSize
	if size <= 0 {
		t.Fatalf("%s has no room to fill (%d usable)", image, c.UsableBytes())
	}
	src := filepath.Join(t.TempDir(), "filler")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("FILLER-0123456789abcdef-"), (1<<20)/24+1)[:1<<20]
	for left := size; left > 0; left -= int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(int64(len(chunk)), left)]); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	Debugfs(t, image, "write "+src+" "+name)
	os.Remove(src)
	return size
}

// Unattach leaves an in-use, non-empty inode that no directory names: the
// state e2fsck can only repair by asking to connect it to lost+found.
func Unattach(t testing.TB, image string) {
	t.Helper()
	Write(t, image, "orphan", []byte("unattached but not empty\n"))
	Debugfs(t, image, "unlink /orphan")
}

// DirtyJournal opens the image's journal and commits a transaction that is
// never checkpointed, so the superblock says needs_recovery, as a guest that
// died (or was stopped without unmounting) leaves it. The transaction
// rewrites block, a data block the caller picks, with data.
func DirtyJournal(t testing.TB, image string, block int64, data []byte) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "jblock")
	os.WriteFile(src, data, 0o600)
	Debugfs(t, image, "jo", "jw -b "+strconv.FormatInt(block, 10)+" "+src)
}

// CorruptMagic overwrites the primary superblock's magic number (offset
// 1024 + 0x38).
func CorruptMagic(t testing.TB, image string) {
	t.Helper()
	f, err := os.OpenFile(image, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{0xde, 0xad}, 1024+0x38); err != nil {
		t.Fatal(err)
	}
}

// SHA256 is the hex digest of the file at path.
func SHA256(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func tool(t testing.TB, name string, args ...string) {
	t.Helper()
	path, err := ext4.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(path, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}
