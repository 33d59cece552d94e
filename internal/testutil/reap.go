package testutil

import (
	"strings"
	"testing"
)

// ProcInconclusive is the reason the reaper gives for keeping an entry
// that no process was seen to name when its /proc scan met a process that
// exited while it was being read (reaper.runGate): ambiguity keeps.
const ProcInconclusive = "/proc scan inconclusive"

// ReapPasses bounds how many reaps ReapUntilConclusive asks for. A pass
// is inconclusive only when some process exits during its scan, so twenty
// in a row means the scan itself is broken, not that the machine is busy.
const ReapPasses = 20

// KeptInconclusive reports whether an entry the reaper kept with this
// verdict and reason was kept only because its /proc scan was
// inconclusive.
func KeptInconclusive(verdict, reason string) bool {
	return verdict == "ambiguous" && strings.Contains(reason, ProcInconclusive)
}

// ReapUntilConclusive runs pass, one reap, until it reports that it kept
// nothing only for an inconclusive /proc scan, and fails the test naming
// what, with the last pass's detail, after ReapPasses that all did. On a
// busy machine processes exit during any scan, and keeping what it could
// not judge is exactly what the reaper owes given that evidence; so a test
// asks again, as an operator would, and asserts every other decision on
// the conclusive pass (pass carries over what earlier passes deleted).
func ReapUntilConclusive(t testing.TB, what string, pass func() (inconclusive bool, detail string)) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		unsure, detail := pass()
		if !unsure {
			return
		}
		if attempt == ReapPasses {
			t.Fatalf("%s: the /proc scan was inconclusive %d times running: %s", what, attempt, detail)
		}
	}
}
