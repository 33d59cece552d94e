//go:build nexustest

package durable

import "os"

// The power-loss tests' negative controls, each a no-op in a test build
// when its variable is 1: under each a cut must lose what the fsync
// would have kept.
var (
	// NEXUS_DURABLE_NO_DIR_FSYNC: SyncDir (and the removals' directory
	// fsync): a published file's name is lost.
	testNoDirFsync = os.Getenv("NEXUS_DURABLE_NO_DIR_FSYNC") == "1"
	// NEXUS_DURABLE_NO_UNLINK_FSYNC: SyncUnlink and SyncUnlinkFd only: a
	// removed file comes back.
	testNoUnlinkFsync = os.Getenv("NEXUS_DURABLE_NO_UNLINK_FSYNC") == "1"
	// NEXUS_DURABLE_NO_SNAPSHOT_FSYNC: SyncDirFiles, what makes a
	// snapshot's files durable: a snapshot loses the VMM's files.
	testNoSnapshotFsync = os.Getenv("NEXUS_DURABLE_NO_SNAPSHOT_FSYNC") == "1"
)
