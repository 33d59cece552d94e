//go:build nexustest

package journal

import "os"

// A test build's switches for the power-loss tests: NEXUS_JOURNAL_NO_FSYNC
// removes every fsync of the journal's own (the negative control: a cut
// must then lose acknowledged events), NEXUS_JOURNAL_SYNC_ALWAYS runs the
// server with SyncAlways, the configuration before group commit.
var (
	testNoFsync    = os.Getenv("NEXUS_JOURNAL_NO_FSYNC") == "1"
	testSyncAlways = os.Getenv("NEXUS_JOURNAL_SYNC_ALWAYS") == "1"
)
