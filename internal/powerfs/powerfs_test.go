package powerfs

import (
	"bytes"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func mount(t *testing.T) (*FS, string) {
	t.Helper()
	base := t.TempDir()
	mnt := filepath.Join(base, "m")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := Mount(filepath.Join(base, "backing"), mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return p, mnt
}

func fsync(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", path, err)
	}
}

func write(t *testing.T, path string, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func cut(t *testing.T, p *FS) {
	t.Helper()
	if err := p.Cut(); err != nil {
		t.Fatal(err)
	}
}

func wantFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("after the cut: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("after the cut %s holds %d bytes %.20q, want %d bytes %.20q", path, len(got), got, len(want), want)
	}
}

func wantGone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after the cut %s: %v, want it gone", path, err)
	}
}

// big spans pages, so partial pages and the durable object both count.
func big(seed byte) []byte {
	b := make([]byte, 3*pageSize+123)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

func TestUnsyncedFileIsGoneAfterACut(t *testing.T) {
	p, mnt := mount(t)
	write(t, filepath.Join(mnt, "f"), big(1), false)
	wantFile(t, filepath.Join(mnt, "f"), big(1)) // reads see what is pending
	cut(t, p)
	wantGone(t, filepath.Join(mnt, "f"))
}

func TestFileDataNotSyncedIsEmptyInASyncedDirectory(t *testing.T) {
	p, mnt := mount(t)
	write(t, filepath.Join(mnt, "f"), big(1), false)
	fsync(t, mnt)
	cut(t, p)
	wantFile(t, filepath.Join(mnt, "f"), nil)
}

func TestSyncedFileSurvivesACut(t *testing.T) {
	p, mnt := mount(t)
	write(t, filepath.Join(mnt, "f"), big(1), true)
	fsync(t, mnt)
	cut(t, p)
	wantFile(t, filepath.Join(mnt, "f"), big(1))

	// Written again and shortened without an fsync: the old bytes stay.
	f, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(10); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("xyz"), 2*pageSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := append(append(big(1)[:10], make([]byte, 2*pageSize-10)...), "xyz"...)
	wantFile(t, filepath.Join(mnt, "f"), want)
	cut(t, p)
	wantFile(t, filepath.Join(mnt, "f"), big(1))
}

func TestRenameRevertsUnlessTheDirectoryIsSynced(t *testing.T) {
	p, mnt := mount(t)
	a, b := filepath.Join(mnt, "a"), filepath.Join(mnt, "b")
	write(t, a, big(1), true)
	fsync(t, mnt)
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	cut(t, p)
	wantFile(t, a, big(1))
	wantGone(t, b)

	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	fsync(t, mnt)
	cut(t, p)
	wantFile(t, b, big(1))
	wantGone(t, a)

	// An unlink not synced comes back too.
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	cut(t, p)
	wantFile(t, b, big(1))
}

func TestSyncedDirectoryKeepsItsEntries(t *testing.T) {
	p, mnt := mount(t)
	d := filepath.Join(mnt, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(d, "f"), big(2), true)
	fsync(t, d)
	// d itself is not in the root's synced entries yet: all of it is gone.
	cut(t, p)
	wantGone(t, d)

	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(d, "f"), big(2), true)
	write(t, filepath.Join(d, "g"), big(3), true)
	fsync(t, d)
	fsync(t, mnt)
	if err := os.Remove(filepath.Join(d, "g")); err != nil {
		t.Fatal(err)
	}
	cut(t, p)
	wantFile(t, filepath.Join(d, "f"), big(2))
	wantFile(t, filepath.Join(d, "g"), big(3))
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
}

// What nexus needs of a state root's filesystem besides files: flock
// between processes' descriptors, and unix sockets bound in it.
func TestLocksAndSocketsWork(t *testing.T) {
	_, mnt := mount(t)
	path := filepath.Join(mnt, "lease")
	write(t, path, nil, false)
	a, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := unix.Flock(int(a.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(b.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("a second flock: %v, want EWOULDBLOCK", err)
	}

	sock := filepath.Join(mnt, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make([]byte, 2)
	if _, err := c.Read(got); err != nil || string(got) != "hi" {
		t.Fatalf("read over the socket: %q, %v", got, err)
	}
}
