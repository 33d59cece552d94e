package fsx

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// NamesMatching returns exactly the names of a directory that match, over
// several getdents batches (long names, more entries than one buffer
// holds), never "." or "..", and nothing of a subdirectory's.
func TestNamesMatching(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "d")
	if err := os.MkdirAll(filepath.Join(dir, "sub.want"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub.want", "inner.want"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want := []string{"sub.want"}
	for i := range 3000 {
		name := fmt.Sprintf("%s-%04d", strings.Repeat("x", 100), i)
		if i%7 == 0 {
			name += ".want"
			want = append(want, name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	seen := 0
	got, err := NamesMatching(root, "d", func(name string) bool {
		seen++
		if name == "." || name == ".." {
			t.Errorf("offered %q", name)
		}
		return strings.HasSuffix(name, ".want")
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("got %d names, want %d (first %v)", len(got), len(want), got[:min(3, len(got))])
	}
	if seen != 3001 {
		t.Fatalf("match saw %d names, want 3001", seen)
	}
	if _, err := NamesMatching(root, "../x", func(string) bool { return true }); err == nil {
		t.Fatal("a directory outside the root was listed")
	}
}
