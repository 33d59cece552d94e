package hostid

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/oklog/ulid/v2"
)

func TestLoadMintsOnceAndKeeps(t *testing.T) {
	root := t.TempDir()
	a, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("identity changed between loads: %s then %s", a, b)
	}
	other, err := Load(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if other == a {
		t.Fatal("two roots share an identity")
	}
	if fi, err := os.Stat(filepath.Join(root, "host-id")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host-id: %v %v", fi, err)
	}
}

// Concurrent first loads must agree: the first published identity wins.
func TestLoadConcurrentAgree(t *testing.T) {
	root := t.TempDir()
	ids := make([]ulid.ULID, 16)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := Load(root)
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent loads disagree: %s vs %s", id, ids[0])
		}
	}
}

func TestLoadRefusesDamagedAndLinks(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "host-id"), []byte("not-a-ulid\n"), 0o600)
	if _, err := Load(root); err == nil {
		t.Fatal("a damaged identity was accepted (or re-minted)")
	}
	if data, _ := os.ReadFile(filepath.Join(root, "host-id")); string(data) != "not-a-ulid\n" {
		t.Fatalf("damaged identity rewritten: %q", data)
	}
	root2 := t.TempDir()
	target := filepath.Join(t.TempDir(), "elsewhere")
	os.Symlink(target, filepath.Join(root2, "host-id"))
	if _, err := Load(root2); err == nil {
		t.Fatal("a symlinked host-id was followed")
	}
	if _, err := os.Stat(target); err == nil {
		t.Fatal("minting wrote through a planted link")
	}
}
