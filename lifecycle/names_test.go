package lifecycle

import (
	"regexp"
	"strings"
	"testing"
)

// The byte-by-byte checks of handles and names accept exactly what their
// patterns do: every byte value in every position, and the length limits.
func TestNameFormsMatchTheirPatterns(t *testing.T) {
	for _, c := range []struct {
		name    string
		check   func(string) bool
		pattern string
		limit   int
	}{
		{"handle", validHandle, `^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$`, 128},
		{"name", ValidName, `^[a-z0-9][a-z0-9_-]{0,62}$`, 63},
	} {
		re := regexp.MustCompile(c.pattern)
		try := func(s string) {
			if got, want := c.check(s), re.MatchString(s); got != want {
				t.Errorf("%s %q: accepted %v, the pattern %v", c.name, s, got, want)
			}
		}
		try("")
		for b := range 256 {
			ch := string([]byte{byte(b)})
			try(ch)
			try("a" + ch)
			try(ch + "a")
			try(strings.Repeat("a", c.limit-1) + ch)
		}
		for _, n := range []int{c.limit - 1, c.limit, c.limit + 1} {
			try(strings.Repeat("a", n))
			try(strings.Repeat("a-", n/2))
		}
		try("a\n")
	}
}
