//go:build nexustest

package durable

import "os"

// NEXUS_DURABLE_NO_DIR_FSYNC=1 makes SyncDir a no-op in a test build: the
// power-loss tests' negative control, under which a cut must lose a
// published file's name.
var testNoDirFsync = os.Getenv("NEXUS_DURABLE_NO_DIR_FSYNC") == "1"
