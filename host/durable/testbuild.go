//go:build !nexustest

package durable

// A release build always fsyncs; testbuild_nexustest.go lets a test build
// leave some fsyncs out.
const (
	testNoDirFsync      = false
	testNoUnlinkFsync   = false
	testNoSnapshotFsync = false
)
