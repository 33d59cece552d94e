package lifecycle

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/node"
)

// An intent its creator died staging (killed between intent.Publish's
// create and rename, as a fork of three children was once at load 30) is
// removed by recover when its lease is free, and kept while a creator
// holds it; other dot files are not intents and stay.
func TestRecoverSweepsStagedIntents(t *testing.T) {
	ctx := context.Background()
	root := shortRoot(t)
	n, err := node.Open(ctx, root, node.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	m := &Manager{Root: layout.Root(root), B: control.Local{Node: n}}
	disks := m.Root.Disks()
	if err := os.MkdirAll(disks, 0o700); err != nil {
		t.Fatal(err)
	}
	plant := func(name string) string {
		t.Helper()
		p := filepath.Join(disks, name)
		if err := os.WriteFile(p, []byte(`{"sandbox":"x"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	deadCreate := plant("." + ulid.Make().String() + ".create-intent.json.stage-1445947824")
	deadShadow := plant(".dev_one.shadow-intent.json.stage-77")
	liveCreate := plant("." + ulid.Make().String() + ".create-intent.json.stage-12")
	other := plant(".notes.stage-1")
	// A running creator holds its staged intent's flock (another open
	// file description than recover's probe, so it conflicts).
	f, err := os.Open(liveCreate)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}

	rep, err := m.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{deadCreate, deadShadow} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("%s: a staged intent whose creator died is still there (%v)", filepath.Base(p), err)
		}
		if !slices.Contains(rep.Intents, filepath.Base(p)) {
			t.Fatalf("report's intents %v miss %s", rep.Intents, filepath.Base(p))
		}
	}
	for _, p := range []string{liveCreate, other} {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("%s removed: %v", filepath.Base(p), err)
		}
	}
	if len(rep.Intents) != 2 {
		t.Fatalf("report's intents: %v", rep.Intents)
	}
}
