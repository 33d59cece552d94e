//go:build nexusd

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/replay"
)

// dial connects, or says which flag is missing (exit 2). A record a read
// skips is reported on stderr.
func (c *fleetConn) dial(cmd *cobra.Command) (*fleet.Auditor, error) {
	return c.dialWith(cmd, fleet.Dial)
}

func (c *fleetConn) dialWith(cmd *cobra.Command, dial func(url, creds string) (*fleet.Auditor, error)) (*fleet.Auditor, error) {
	if c.url == "" {
		c.url = os.Getenv("NEXUS_FLEET_URL")
	} else if strings.Contains(c.url, "@") {
		fmt.Fprintln(cmd.ErrOrStderr(), "nexus: warning: the fleet credentials are on the command line, readable in /proc/<pid>/cmdline: pass the URL in NEXUS_FLEET_URL or use --nats-creds")
	}
	if c.url == "" {
		return nil, usageError{errors.New("name the fleet with --nats URL or NEXUS_FLEET_URL")}
	}
	f, err := dial(c.url, c.creds)
	if err != nil {
		return nil, err
	}
	f.Reject = func(r fleet.Rejected) { warnSkipped(cmd, r) }
	return f, nil
}

// fleetReader reads the aggregate from r's position, with the filters
// the caller decides (replay.FleetReader).
func fleetReader(ctx context.Context, f *fleet.Auditor, r fleet.Range) replay.FleetReader {
	return func(filters []string, fn func(replay.FleetRecord) error) error {
		r := r
		r.Filters = filters
		return f.Scan(ctx, r, func(rec fleet.Record) error {
			return fn(replay.FleetRecord{Host: rec.Host, Seq: rec.HostSeq, FleetSeq: rec.Seq, Data: rec.Data})
		})
	}
}

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
	f, err := conn.dialWith(cmd, dial)
	if err != nil {
		return err
	}
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

// fleetEvents prints the aggregate's events from --since, filtered.
func fleetEvents(cmd *cobra.Command, conn *fleetConn, hosts, types []string, sandbox, since string, follow bool, o *output) error {
	var r fleet.Range
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
	filters, err := fleetEventFilters(fleetReader(ctx, f, fleet.Range{}), hosts, sandbox, types)
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
	// little alive (the batches in flight) and allocates for each
	// record: collecting less often costs little memory and much less
	// time.
	debug.SetGCPercent(400)
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
	rows, err := read(fleetReader(cmd.Context(), f, fleet.Range{}), ref)
	if err != nil {
		return err
	}
	return printList(cmd, o, rows, id, t)
}
