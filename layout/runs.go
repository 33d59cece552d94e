package layout

import "strings"

// ValidRunID reports whether s may name a run (and so three files):
// [A-Za-z0-9][A-Za-z0-9_-]{0,127}. Checked by hand, not by regexp: a sweep
// checks every file name under runs/.
func ValidRunID(s string) bool { return validToken(s, "_-") }

// ValidSandboxRef reports whether s may be a line of a .sandboxes or .networks
// file: a sandbox reference as `nexus rm` takes it (a ULID or a handle),
// [A-Za-z0-9][A-Za-z0-9._/-]{0,127} without "..".
func ValidSandboxRef(s string) bool { return validToken(s, "._/-") && !strings.Contains(s, "..") }

func validToken(s, extra string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || strings.IndexByte(extra, c) < 0) {
			return false
		}
	}
	return true
}
