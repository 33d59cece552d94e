package testutil

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// ScaleEnv multiplies every poll deadline of the tests (a float, e.g. 2.5).
// Unset, it is 3 under -race (instrumented binaries are several times
// slower) and 1 otherwise. A deadline is a bound on a wait for a condition,
// never a timing being asserted, so raising it only makes a failure slower
// to report.
const ScaleEnv = "NEXUS_TEST_TIMEOUT_SCALE"

// Scale returns d multiplied by the factor ScaleEnv sets. An unparsable or
// non-positive value is ignored rather than failing every test.
func Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * factor())
}

func factor() float64 {
	if v, err := strconv.ParseFloat(os.Getenv(ScaleEnv), 64); err == nil && v > 0 {
		return v
	}
	if RaceEnabled {
		return 3
	}
	return 1
}

// WaitUntil polls cond every 20 ms until it holds, failing the test naming
// what once Scale(limit) has passed.
func WaitUntil(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	limit = Scale(limit)
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
