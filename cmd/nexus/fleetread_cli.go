//go:build !nexusd && !nexusfleet

// The CLI links no NATS client: the fleet-wide reads run in nexus-fleet,
// the binary beside it (cmd/nexus built with -tags nexusfleet), which the
// command execs with its own arguments. nexusd is no place for them: a
// read would pay nats-server's start-up.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/replay"
)

// fleetBinary is nexus-fleet, beside this executable as nexus, nexusd and
// it are installed.
func fleetBinary() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), "nexus-fleet")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("nexus-fleet, which runs the fleet-wide reads, is not beside %s (install it with nexus): %w", exe, err)
	}
	return p, nil
}

// execFleet replaces this process with nexus-fleet, given the same
// arguments: it runs the read in full.
func execFleet() error {
	p, err := fleetBinary()
	if err != nil {
		return err
	}
	return execAs(p)
}

func fleetEvents(*cobra.Command, *fleetConn, []string, []string, string, string, bool, *output) error {
	return execFleet()
}

func fleetSandbox[T any](*cobra.Command, *fleetConn, *output, func(replay.FleetReader, string) ([]T, error), func(T) string, table[T], string) error {
	return execFleet()
}
