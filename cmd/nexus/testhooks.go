//go:build nexustest

// A binary built with -tags nexustest, which is what the tests build, has
// the failure injection of internal/testhooks and the demo command; see
// release.go for a release build.
package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/internal/testhooks"
	"github.com/nexus-sandbox/nexus/session"
)

// testCommands are the commands only a test build has.
func testCommands(g *globals) []*cobra.Command { return []*cobra.Command{demoCmd(g), testfillCmd(g)} }

func testHooks() session.Hook { return testhooks.SagaHooks() }

func watchInterrupt(ctx context.Context) { testhooks.WatchInterrupt(ctx) }

func spawnLockHook() func() { return testhooks.SpawnLock() }

func ensuredHook() func() { return testhooks.Ensured() }

func earlyOpenHook() func() { return testhooks.EarlyOpen() }

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

// testfillCmd appends stopped sandboxes with their small sparse files, the
// fixture benchmarks and outside checks build their roots with
// (testhooks.Fill), through whatever the command reaches: the daemon, or
// the store in this process.
func testfillCmd(g *globals) *cobra.Command {
	var n, batch int
	c := &cobra.Command{
		Use:    "testfill --sandboxes N",
		Hidden: true,
		Short:  "Append N stopped sandboxes with small sparse disks, some with snapshots and volumes (test build)",
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n < 0 || batch < 0 {
				return usageError{fmt.Errorf("--sandboxes %d --batch %d: not counts", n, batch)}
			}
			return withBackend(cmd.Context(), g, func(b control.Backend) error {
				t0 := time.Now()
				ids, err := testhooks.Fill(cmd.Context(), b, g.stateDir, testhooks.FillOptions{Sandboxes: n, Batch: batch})
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "appended %d sandboxes in %v\n", len(ids), time.Since(t0).Round(time.Millisecond))
				return nil
			})
		},
	}
	c.Flags().IntVar(&n, "sandboxes", 0, "how many sandboxes to append")
	c.Flags().IntVar(&batch, "batch", 0, "events per append (0: the default)")
	requireFlags(c, "sandboxes")
	return c
}
