package lifecycle

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLastLinesStart(t *testing.T) {
	long := strings.Repeat("x", tailChunk-3) // lines that straddle chunk boundaries
	var many strings.Builder
	for i := range 5 {
		fmt.Fprintf(&many, "%d%s\n", i, long)
	}
	for _, c := range []struct {
		name, log string
		n         int
		want      string
	}{
		{"empty", "", 3, ""},
		{"fewer lines than asked", "a\nb\n", 5, "a\nb\n"},
		{"last line", "a\nb\nc\n", 1, "c\n"},
		{"last two", "a\nb\nc\n", 2, "b\nc\n"},
		{"unterminated last line", "a\nb\nc", 1, "c"},
		{"unterminated, two", "a\nb\nc", 2, "b\nc"},
		{"blank lines count", "a\n\n\n", 2, "\n\n"},
		{"across chunks", many.String(), 2, fmt.Sprintf("3%s\n4%s\n", long, long)},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			if err := os.WriteFile(path, []byte(c.log), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			start, err := lastLinesStart(f, c.n)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(io.NewSectionReader(f, start, 1<<40))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.want {
				t.Fatalf("last %d lines of %q = %q, want %q", c.n, short(c.log), short(string(got)), short(c.want))
			}
		})
	}
}

func short(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%s...(%d bytes)", s[:40], len(s))
	}
	return s
}

func TestLineStart(t *testing.T) {
	long := strings.Repeat("y", tailChunk+5) // a line longer than a chunk
	log := "a\nbb\n" + long + "\nc"
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	longAt := int64(len("a\nbb\n"))
	for _, c := range []struct{ off, want int64 }{
		{0, 0}, {1, 0}, {2, 2}, {3, 2}, {5, 5}, {longAt + 7, longAt}, {longAt + tailChunk + 3, longAt},
		{int64(len(log)) - 1, int64(len(log)) - 1}, {int64(len(log)), int64(len(log)) - 1},
	} {
		if got, err := lineStart(f, c.off); err != nil || got != c.want {
			t.Errorf("lineStart(%d) = %d, %v; want %d", c.off, got, err, c.want)
		}
	}
}
