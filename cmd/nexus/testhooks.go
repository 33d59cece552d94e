//go:build nexustest

// A binary built with -tags nexustest, which is what the tests build, has
// the failure injection of internal/testhooks and the demo command; see
// release.go for a release build.
package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/internal/testhooks"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// testCommands are the commands only a test build has.
func testCommands(g *globals) []*cobra.Command { return []*cobra.Command{demoCmd(g)} }

func testHooks() lifecycle.Hook { return testhooks.SagaHooks() }

func spawnLockHook() func() { return testhooks.SpawnLock() }

func ensuredHook() func() { return testhooks.Ensured() }

func failAppends(b control.Backend) control.Backend { return testhooks.FailAppends(b) }

// demoCmd journals the events of one simulated sandbox lifecycle through
// the real saga runner and journal. It creates no VM and no disk: it shows
// the event flow.
func demoCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "demo",
		Hidden: true,
		Short:  "Journal a simulated sandbox lifecycle (no VM, no disks) to show the event flow",
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withBackend(cmd.Context(), g, func(b control.Backend) error {
				id, err := testhooks.Demo(cmd.Context(), b)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "journaled a simulated lifecycle for sandbox %s\n", id)
				return nil
			})
		},
	}
}
