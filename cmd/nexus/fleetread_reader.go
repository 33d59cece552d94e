//go:build nexusd || nexusfleet

// The fleet-wide reads over the NATS client, linked by nexus-fleet (built
// with -tags nexusfleet) and nexusd; the CLI execs nexus-fleet for them
// (fleetread_cli.go), so no other command pays the NATS client's package
// initialisation.
package main

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleetread"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/replay"
)

// dial connects as an auditor. A record a read skips is reported on
// stderr.
func (c *fleetConn) dial(cmd *cobra.Command) (*fleetread.Reader, error) {
	if err := c.resolve(cmd); err != nil {
		return nil, err
	}
	f, err := fleetread.Dial(c.url, c.creds)
	if err != nil {
		return nil, err
	}
	f.Reject = func(r fleetstate.Rejected) { warnSkipped(cmd, r) }
	return f, nil
}

// fleetReader reads the aggregate from r's position, with the filters
// the caller decides (replay.FleetReader).
func fleetReader(ctx context.Context, f *fleetread.Reader, r fleetread.Range) replay.FleetReader {
	return func(filters []string, fn func(replay.FleetRecord) error) error {
		r := r
		r.Filters = filters
		return f.Scan(ctx, r, func(rec fleetread.Record) error {
			return fn(replay.FleetRecord{Host: rec.Host, Seq: rec.HostSeq, FleetSeq: rec.Seq, Data: rec.Data})
		})
	}
}

// fleetEvents prints the aggregate's events from --since, filtered.
func fleetEvents(cmd *cobra.Command, conn *fleetConn, hosts, types []string, sandbox, since string, follow bool, o *output) error {
	var r fleetread.Range
	var err error
	if r.From, r.FromTime, err = parsePosition("--since", since, time.Now()); err != nil {
		return usageError{err}
	}
	if _, err := events.FilterSubjects(types, ""); err != nil {
		return usageError{err}
	}
	for _, h := range hosts {
		if err := fleetstate.ValidHostName(h); err != nil {
			return usageError{fmt.Errorf("--host: %w", err)}
		}
	}
	r.Follow = follow
	f, err := conn.dial(cmd)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx := cmd.Context()
	filters, err := fleetEventFilters(fleetReader(ctx, f, fleetread.Range{}), hosts, sandbox, types)
	if err != nil {
		return err
	}
	if follow {
		err = fleetReader(ctx, f, r)(filters, printFleetEvent(cmd.OutOrStdout(), cmd.ErrOrStderr(), o))
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	// A whole read is decoded on every core and written a batch at a
	// time; a followed one is written as each event comes. It keeps
	// little alive (the batches in flight), and what it allocates for
	// each record is the NATS client's (a line allocates nothing): at
	// twice the default the collections it saves cost more than the
	// page faults of the heap's growth to a goal twice as large (a
	// minimum of 8 MB, not 16).
	debug.SetGCPercent(200)
	return printFleetEventsOrdered(cmd.OutOrStdout(), cmd.ErrOrStderr(), o, func(fn func(replay.FleetRecord) error) error {
		return fleetReader(ctx, f, r)(filters, fn)
	})
}

// fleetSandbox reads the whole aggregate about one sandbox and prints the
// rows read makes of it.
func fleetSandbox[T any](cmd *cobra.Command, conn *fleetConn, o *output, read func(replay.FleetReader, string) ([]T, error), id func(T) string, t table[T], ref string) error {
	f, err := conn.dial(cmd)
	if err != nil {
		return err
	}
	defer f.Close()
	rows, err := read(fleetReader(cmd.Context(), f, fleetread.Range{}), ref)
	if err != nil {
		return err
	}
	return printList(cmd, o, rows, id, t)
}
