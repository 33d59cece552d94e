//go:build nexusd

package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
)

// fleetAggregate creates or extends the fleet's aggregate stream, and
// with keep goes on keeping it until interrupted.
func fleetAggregate(cmd *cobra.Command, conn *fleetConn, names []string, replicas int, keep bool) error {
	for _, h := range names {
		if err := fleetstate.ValidHostName(h); err != nil {
			return usageError{fmt.Errorf("--host: %w", err)}
		}
	}
	if replicas < 0 || replicas > 5 {
		return usageError{fmt.Errorf("--replicas %d: want 1 to 5", replicas)}
	}
	dial := fleet.Dial
	if keep {
		dial = fleet.DialAggregator
	}
	if err := conn.resolve(cmd); err != nil {
		return err
	}
	f, err := dial(conn.url, conn.creds)
	if err != nil {
		return err
	}
	f.Reject = func(r fleet.Rejected) { warnSkipped(cmd, r) }
	defer f.Close()
	added, err := f.EnsureAggregate(cmd.Context(), names, replicas)
	if err != nil {
		return err
	}
	all, err := f.AggregateSources(cmd.Context())
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: sourced from %s (added: %s)\n", fleet.AggregateStream, strings.Join(all, ", "), dash(strings.Join(added, ", ")))
	if !keep {
		return nil
	}
	// Until the first SIGINT or SIGTERM, which cancels the command's
	// context.
	return f.KeepAggregate(cmd.Context(), names, replicas, fleet.KeepInterval, fleet.KeepResumeEvery, func(s string) {
		fmt.Fprintf(cmd.ErrOrStderr(), "nexus: %s %s\n", time.Now().UTC().Format(time.RFC3339), s)
	})
}
