//go:build !nexustest

package journal

// A release build always fsyncs, and leaves the server's SyncAlways off
// (sync.go); testbuild_nexustest.go lets a test build change either.
const (
	testNoFsync    = false
	testSyncAlways = false
)
