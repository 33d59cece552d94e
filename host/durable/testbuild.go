//go:build !nexustest

package durable

// A release build always fsyncs the directory; testbuild_nexustest.go lets
// a test build leave it out.
const testNoDirFsync = false
