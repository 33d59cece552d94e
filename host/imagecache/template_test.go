package imagecache

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/layout"
)

func e2fsckClean(t *testing.T, image string) {
	t.Helper()
	e2fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		e2fsck = "/usr/sbin/e2fsck"
	}
	if out, err := exec.Command(e2fsck, "-fn", image).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck -fn %s: %v\n%s", image, err, out)
	}
}

// TestTemplateMadeOnceAndCloned: makers racing on one size make the
// template exactly once, leave no preparation dir, and a clone of it is a
// clean empty ext4 (e2fsck -fn) of that size; a second size is its own.
func TestTemplateMadeOnceAndCloned(t *testing.T) {
	root := layout.Root(t.TempDir())
	const size = 64 << 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	made, paths := 0, map[string]bool{}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, m, err := Template(root, size)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			paths[p] = true
			if m {
				made++
			}
		}()
	}
	wg.Wait()
	if made != 1 || len(paths) != 1 {
		t.Fatalf("made %d times, paths %v", made, paths)
	}
	names, _ := os.ReadDir(root.Images())
	for _, n := range names {
		if strings.HasPrefix(n.Name(), ".prepare-") {
			t.Fatalf("left %s", n.Name())
		}
	}
	tmpl := root.OverlayTemplateDisk(size)
	info, _ := os.Stat(tmpl)
	if _, m, err := Template(root, size); err != nil || m {
		t.Fatalf("second call made=%v err=%v", m, err)
	}
	if again, _ := os.Stat(tmpl); !again.ModTime().Equal(info.ModTime()) {
		t.Fatal("the template was rewritten")
	}
	clone := filepath.Join(t.TempDir(), "ws.raw")
	if _, err := disk.Clone(tmpl, clone); err != nil {
		t.Fatal(err)
	}
	e2fsckClean(t, clone)
	if st, _ := disk.Stat(clone); st.Apparent != size {
		t.Fatalf("clone is %d bytes", st.Apparent)
	}
	if p, m, err := Template(root, 2*size); err != nil || !m || p == tmpl {
		t.Fatalf("another size: %s %v %v", p, m, err)
	}
}

// TestTemplateDamaged: a template that is a symlink, or of the wrong size,
// is refused (one line naming what to remove), never followed or reused.
func TestTemplateDamaged(t *testing.T) {
	root := layout.Root(t.TempDir())
	const size = 32 << 20
	if err := os.MkdirAll(root.Images(), 0o700); err != nil {
		t.Fatal(err)
	}
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, root.OverlayTemplate(size)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Template(root, size); !errors.Is(err, ErrDamaged) {
		t.Fatalf("symlinked template: %v", err)
	}
	os.Remove(root.OverlayTemplate(size))
	if err := os.Mkdir(root.OverlayTemplate(size), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(root.OverlayTemplateDisk(size), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := Template(root, size)
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "remove "+root.OverlayTemplate(size)) {
		t.Fatalf("short template: %v", err)
	}
}
