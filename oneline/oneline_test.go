package oneline

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"  \n\t ", ""},
		{"one", "one"},
		{"e2fsck: bad\n\n  Pass 1:\tcheck\n", "e2fsck: bad Pass 1: check"},
		{"a\r\nb", "a b"},
	} {
		if got := Of(tc.in); got != tc.want {
			t.Errorf("Of(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestOfBounded(t *testing.T) {
	long := strings.Repeat("é", Max) // 2 bytes each: the cut lands mid-rune
	got := Of(long)
	if !strings.HasSuffix(got, "…") || len(got) > Max+len("…") || !utf8.ValidString(got) {
		t.Fatalf("Of(long) = %d bytes, valid %v, suffix %q", len(got), utf8.ValidString(got), got[len(got)-5:])
	}
	if exact := strings.Repeat("x", Max); Of(exact) != exact {
		t.Fatal("a line of exactly Max bytes was cut")
	}
}
