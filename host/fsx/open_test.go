package fsx

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// plant builds a root with a FIFO, a socket, a file symlink, a dir symlink
// and a regular file, and an outside directory the links point into.
func plant(t *testing.T) (root, outside string) {
	t.Helper()
	root, outside = t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(outside, "secret"), []byte("outside"), 0o600))
	must(os.MkdirAll(filepath.Join(root, "d"), 0o700))
	must(os.WriteFile(filepath.Join(root, "d", "file"), []byte("inside"), 0o600))
	must(unix.Mkfifo(filepath.Join(root, "d", "fifo"), 0o600))
	l, err := net.Listen("unix", filepath.Join(root, "d", "sock"))
	must(err)
	t.Cleanup(func() { l.Close() })
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "d", "link")))
	must(os.Symlink(outside, filepath.Join(root, "dirlink")))
	return root, outside
}

func TestOpenRefusesSpecialFilesAndLinks(t *testing.T) {
	root, _ := plant(t)
	cases := []struct {
		name string
		want error
	}{
		{"d/fifo", ErrNotRegular},
		{"d/sock", nil}, // ENXIO from the kernel or ErrNotRegular; either way an error, checked below
		{"d/link", ErrSymlink},
		{"dirlink/secret", ErrSymlink},
		{"d", ErrNotRegular},
		{"../x", ErrEscapes},
	}
	for _, c := range cases {
		for _, how := range []struct {
			what string
			open func() error
		}{
			{"ReadFile", func() error { _, err := ReadFile(root, c.name); return err }},
			{"OpenFile(O_WRONLY)", func() error {
				f, err := OpenFile(root, c.name, os.O_WRONLY, 0)
				if err == nil {
					f.Close()
				}
				return err
			}},
			{"OpenFile(O_RDWR|O_CREATE)", func() error {
				f, err := OpenFile(root, c.name, os.O_RDWR|os.O_CREATE, 0o600)
				if err == nil {
					f.Close()
				}
				return err
			}},
		} {
			err := how.open()
			if err == nil {
				t.Errorf("%s(%s) succeeded", how.what, c.name)
				continue
			}
			if c.want != nil && !errors.Is(err, c.want) && !(c.name == "d" && errors.Is(err, unix.EISDIR)) {
				t.Errorf("%s(%s) = %v, want %v", how.what, c.name, err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("%s(%s): error is not one line: %q", how.what, c.name, err)
			}
		}
	}
	// Absolute paths beneath the root work; absolute paths elsewhere do not.
	if data, err := ReadFile(root, filepath.Join(root, "d", "file")); err != nil || string(data) != "inside" {
		t.Fatalf("ReadFile(abs) = %q, %v", data, err)
	}
	if _, err := ReadFile(root, "/etc/hostname"); !errors.Is(err, ErrEscapes) {
		t.Fatalf("ReadFile(/etc/hostname) = %v, want ErrEscapes", err)
	}
}

func TestOpenDirAndMkdirAllRefuseLinks(t *testing.T) {
	root, outside := plant(t)
	if _, err := OpenDir(root, "dirlink"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("OpenDir(dirlink) = %v", err)
	}
	if _, err := OpenDir(root, "d/fifo"); !errors.Is(err, ErrNotDir) && !errors.Is(err, unix.ENOTDIR) {
		t.Fatalf("OpenDir(fifo) = %v", err)
	}
	if err := MkdirAll(root, "dirlink/new/deeper", 0o700); !errors.Is(err, ErrSymlink) {
		t.Fatalf("MkdirAll through a link = %v", err)
	}
	if _, err := os.Lstat(filepath.Join(outside, "new")); !os.IsNotExist(err) {
		t.Fatalf("MkdirAll created outside the root: %v", err)
	}
	if err := MkdirAll(root, "d/file/x", 0o700); err == nil {
		t.Fatal("MkdirAll through a regular file succeeded")
	}
	if err := MkdirAll(root, "a/b/c", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAll(root, filepath.Join(root, "a", "b", "c"), 0o700); err != nil {
		t.Fatalf("MkdirAll of an existing dir: %v", err)
	}
	if err := Mkdir(root, "a/b/c", 0o700); !errors.Is(err, os.ErrExist) {
		t.Fatalf("Mkdir of an existing dir = %v, want ErrExist", err)
	}
	if err := Mkdir(root, "dirlink/x", 0o700); !errors.Is(err, ErrSymlink) {
		t.Fatalf("Mkdir through a link = %v", err)
	}
}

func TestWriteFileIsDurableAndNeverFollows(t *testing.T) {
	root, outside := plant(t)
	if err := WriteFile(root, "d/new.json", []byte("v1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(root, "d/new.json", []byte("v2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "d", "new.json")); string(data) != "v2" {
		t.Fatalf("got %q", data)
	}
	if err := WriteFile(root, "dirlink/secret", []byte("pwned"), 0o600); !errors.Is(err, ErrSymlink) {
		t.Fatalf("WriteFile through a linked dir = %v", err)
	}
	// Replacing a link at the final name replaces the link, never its target.
	if err := WriteFile(root, "d/link", []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(outside, "secret")); string(data) != "outside" {
		t.Fatalf("outside file changed: %q", data)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "d"))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Fatalf("temp left behind: %s", e.Name())
		}
	}
	if st, err := Stat(root, "d/new.json"); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("Stat = %v, %v", st, err)
	}
}

// Replace is WriteFile without the fsyncs: the same whole-file swap and
// the same refusal of links, for a self-checking cache.
func TestReplaceSwapsWholeFilesAndNeverFollows(t *testing.T) {
	root, outside := plant(t)
	for _, v := range []string{"v1", "v2"} {
		if err := Replace(root, "d/cache", []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(root, "d", "cache")); string(data) != "v2" {
		t.Fatalf("got %q", data)
	}
	if err := Replace(root, "dirlink/secret", []byte("pwned"), 0o600); !errors.Is(err, ErrSymlink) {
		t.Fatalf("Replace through a linked dir = %v", err)
	}
	if err := Replace(root, "d/link", []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(outside, "secret")); string(data) != "outside" {
		t.Fatalf("outside file changed: %q", data)
	}
	if st, err := Stat(root, "d/cache"); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("Stat = %v, %v", st, err)
	}
}
