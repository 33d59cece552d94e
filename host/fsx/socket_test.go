package fsx

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestOpenSocketRefusesLinksAndNonSockets(t *testing.T) {
	root, outside := plant(t)
	ln, err := net.Listen("unix", filepath.Join(outside, "real.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Symlink(filepath.Join(outside, "real.sock"), filepath.Join(root, "linked.sock")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "plain.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	own, err := net.Listen("unix", filepath.Join(root, "own.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	for name, want := range map[string]error{"linked.sock": ErrSymlink, "plain.sock": ErrNotSocket, "own.sock": nil} {
		f, err := OpenSocket(root, name)
		if f != nil {
			f.Close()
		}
		if !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Errorf("OpenSocket(%s) = %v, want %v", name, err, want)
		}
	}
}
