package wire

import (
	"slices"
	"testing"
)

// A path-owners body carries any path but one with a NUL byte unchanged,
// and an answer is read only if it has one line per path.
func TestPathOwnersEncoding(t *testing.T) {
	paths := []string{"disks/a\nb", "", "disks/%41&x=y", "disks/\xff", "snapshots/S/memory"}
	body, err := AppendPaths(nil, paths)
	if err != nil {
		t.Fatal(err)
	}
	got, err := SplitPaths(string(body))
	if err != nil || !slices.Equal(got, paths) {
		t.Fatalf("SplitPaths = %q, %v; want %q", got, err, paths)
	}
	if _, err := AppendPaths(nil, []string{"a\x00b"}); err != ErrPathHasNUL {
		t.Fatalf("a NUL byte: %v", err)
	}
	if _, err := SplitPaths("disks/a\x00disks/b"); err == nil {
		t.Fatal("a body whose last path is not ended was read")
	}
	if got, err := SplitOwners("A\n\nB\n", 3); err != nil || !slices.Equal(got, []string{"A", "", "B"}) {
		t.Fatalf("SplitOwners = %q, %v", got, err)
	}
	for _, bad := range []string{"A\nB\n", "A\n\nB", "A\n\nB\n\n"} {
		if _, err := SplitOwners(bad, 3); err == nil {
			t.Fatalf("answer %q read as 3 owners", bad)
		}
	}
}
