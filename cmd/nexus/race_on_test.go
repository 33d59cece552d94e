//go:build race

package main

// raceEnabled: this test binary runs under -race, so the concurrency test
// builds race-instrumented nexus binaries for the daemon, the reaper and
// the lifecycle commands too.
const raceEnabled = true
