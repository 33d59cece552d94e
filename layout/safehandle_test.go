package layout

import (
	"strings"
	"testing"
)

// isHandleChars reports whether s uses only the handle charset
// [A-Za-z0-9._/-] (lifecycle checks the rest of a handle's rules).
func isHandleChars(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._/-", c)) {
			return false
		}
	}
	return true
}

func TestSafeHandleKeepsSpecNamesAndSeparatesUnderscore(t *testing.T) {
	for handle, want := range map[string]string{
		"dev/one": "dev_one", // SPEC.md: "/" -> "_"
		"a/b":     "a_b",
		"a_b":     "a+b",
		"a_/b":    "a+_b",
		"a/_b":    "a_+b",
		"plain":   "plain",
	} {
		if got := SafeHandle(handle); got != want {
			t.Errorf("SafeHandle(%q) = %q, want %q", handle, got, want)
		}
		if back, ok := HandleOf(want); !ok || back != handle {
			t.Errorf("HandleOf(%q) = %q, %v; want %q", want, back, ok, handle)
		}
	}
	for _, bad := range []string{"", "a%5Fb", "a b", "a/b", "é"} {
		if h, ok := HandleOf(bad); ok {
			t.Errorf("HandleOf(%q) = %q, want refused", bad, h)
		}
	}
	r := Root("/r")
	if r.ShadowDisk("a/b", "x") == r.ShadowDisk("a_b", "x") || r.ShadowIntent("a/b") == r.ShadowIntent("a_b") {
		t.Fatal("a/b and a_b share a path")
	}
}

// FuzzSafeHandle: over the handle charset the mapping is injective and
// HandleOf inverts it; over any name HandleOf accepts, SafeHandle inverts
// HandleOf, so a name parsed back names exactly one handle.
func FuzzSafeHandle(f *testing.F) {
	for _, s := range [][2]string{{"a/b", "a_b"}, {"a_/b", "a/_b"}, {"x", "x"}, {"a+b", "a_b"}, {"__", "//"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if isHandleChars(a) {
			if back, ok := HandleOf(SafeHandle(a)); !ok || back != a {
				t.Fatalf("HandleOf(SafeHandle(%q)) = %q, %v", a, back, ok)
			}
			if isHandleChars(b) && a != b && SafeHandle(a) == SafeHandle(b) {
				t.Fatalf("%q and %q both map to %q", a, b, SafeHandle(a))
			}
		}
		if h, ok := HandleOf(a); ok {
			if SafeHandle(h) != a {
				t.Fatalf("SafeHandle(HandleOf(%q)) = %q", a, SafeHandle(h))
			}
			if !isHandleChars(h) {
				t.Fatalf("HandleOf(%q) = %q, outside the handle charset", a, h)
			}
		}
	})
}

func TestShadowName(t *testing.T) {
	r := Root("/state")
	for _, tc := range []struct{ path, want string }{
		{r.ShadowDisk("dev/a.shadow.x", "cfg"), "cfg"},
		{r.ForkShadowDisk("01J0000000000000000000000", "dev/b", "data-1"), "data-1"},
	} {
		if got, ok := ShadowName(tc.path); !ok || got != tc.want {
			t.Errorf("ShadowName(%s) = %q %v, want %q", tc.path, got, ok, tc.want)
		}
	}
	for _, p := range []string{r.WorkspaceDisk("x"), r.RawDisk("x"), "/state/disks/a.shadow..ext4"} {
		if got, ok := ShadowName(p); ok {
			t.Errorf("ShadowName(%s) = %q, want none", p, got)
		}
	}
}
