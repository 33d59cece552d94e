package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/replay"
)

// fleetConn is how the fleet-wide commands reach the fleet: as an auditor
// of `nexus fleet template`.
type fleetConn struct {
	url, creds string
}

func (c *fleetConn) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&c.url, "nats", "", "a fleet node's client URL, as the auditor (default $NEXUS_FLEET_URL, which keeps a password off the command line)")
	cmd.Flags().StringVar(&c.creds, "nats-creds", "", "NATS .creds file for the auditor")
}

// dial connects, or says which flag is missing (exit 2).
func (c *fleetConn) dial(cmd *cobra.Command) (*fleet.Auditor, error) {
	if c.url == "" {
		c.url = os.Getenv("NEXUS_FLEET_URL")
	} else if strings.Contains(c.url, "@") {
		fmt.Fprintln(cmd.ErrOrStderr(), "nexus: warning: the fleet credentials are on the command line, readable in /proc/<pid>/cmdline: pass the URL in NEXUS_FLEET_URL or use --nats-creds")
	}
	if c.url == "" {
		return nil, usageError{errors.New("name the fleet with --nats URL or NEXUS_FLEET_URL")}
	}
	return fleet.Dial(c.url, c.creds)
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

func fleetAggregateCmd() *cobra.Command {
	var conn fleetConn
	var hosts []string
	var replicas int
	c := &cobra.Command{
		Use:   "aggregate --host NAME [--host NAME...]",
		Short: "Create the fleet's aggregate stream (" + fleet.AggregateStream + ") from the hosts' mirrors, or add hosts to it",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var names []string
			for _, h := range hosts {
				names = append(names, strings.Split(h, ",")...)
			}
			if len(names) == 0 {
				return usageError{errors.New("name at least one --host")}
			}
			for _, h := range names {
				if err := fleet.ValidHostName(h); err != nil {
					return usageError{fmt.Errorf("--host: %w", err)}
				}
			}
			if replicas < 0 || replicas > 5 {
				return usageError{fmt.Errorf("--replicas %d: want 1 to 5", replicas)}
			}
			f, err := conn.dial(cmd)
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
			return nil
		},
	}
	conn.flags(c)
	c.Flags().StringArrayVar(&hosts, "host", nil, "a host name of the fleet (repeat, or separate with commas)")
	c.Flags().IntVar(&replicas, "replicas", 0, "replicas when created (0: 3 where the fleet has room, else 1)")
	return c
}

func fleetEventsCmd() *cobra.Command {
	var conn fleetConn
	var hosts, types []string
	var sandbox, since string
	var follow bool
	var o *output
	c := &cobra.Command{
		Use:   "events",
		Short: "Print every host's events from the fleet's aggregate, one a line, each with its host",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var r fleet.Range
			var err error
			if r.From, r.FromTime, err = parsePosition("--since", since, time.Now()); err != nil {
				return usageError{err}
			}
			if _, err := events.FilterSubjects(types, ""); err != nil {
				return usageError{err}
			}
			for _, h := range hosts {
				if err := fleet.ValidHostName(h); err != nil {
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
			out := cmd.OutOrStdout()
			err = fleetReader(ctx, f, r)(filters, func(rec replay.FleetRecord) error {
				e, err := replay.DecodeFleet(rec)
				if err != nil {
					return err
				}
				return printStreamed(out, o, e, e.ID, func() string { return fleetLine(e) })
			})
			if follow && errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	conn.flags(c)
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	c.Flags().StringVar(&since, "since", "", "start at an aggregate sequence (42), a time (RFC 3339) or an age (10m, 7d)")
	c.Flags().StringArrayVar(&hosts, "host", nil, "only this host's events; repeats")
	c.Flags().StringVar(&sandbox, "sandbox", "", "only events of this sandbox (ID, or a handle on whichever hosts have it)")
	c.Flags().StringArrayVar(&types, "type", nil, "only this event type (e.g. sandbox.created) or category (e.g. mirror); repeats")
	o = addOutput(c, true)
	c.Flags().Lookup("json").Usage = "one JSON object a line (see docs/json.md)"
	return c
}

// fleetEventFilters: a handle names a sandbox per host, so it becomes one
// filter per host that has it (within --host).
func fleetEventFilters(read replay.FleetReader, hosts []string, sandbox string, types []string) ([]string, error) {
	if sandbox == "" {
		return replay.FleetFilters(hosts, "", types)
	}
	if _, err := ulid.ParseStrict(sandbox); err == nil {
		return replay.FleetFilters(hosts, sandbox, types)
	}
	found, err := replay.FleetLocate(read, sandbox)
	if err != nil {
		return nil, err
	}
	var filters []string
	for _, l := range found {
		if len(hosts) > 0 && !slices.Contains(hosts, l.Host) {
			continue
		}
		fs, err := replay.FleetFilters([]string{l.Host}, l.ID, types)
		if err != nil {
			return nil, err
		}
		filters = append(filters, fs...)
	}
	if len(filters) == 0 {
		return nil, fmt.Errorf("no host's events name sandbox %q", sandbox)
	}
	return filters, nil
}

func fleetLine(e replay.FleetEntry) string {
	data, _ := json.Marshal(e.Payload)
	line := fmt.Sprintf("%6d  %-12s %6d  %s  %-22s %-26s %s", e.FleetSeq, e.Host, e.Seq, e.Time.Format("2006-01-02T15:04:05.000Z"), e.Type, dash(e.Sandbox), data)
	if e.Saga != "" {
		line += "  saga=" + e.Saga + " step=" + e.Step
	}
	return line
}

func fleetFindCmd() *cobra.Command {
	return fleetSandboxCmd("find ID|HANDLE", "Which hosts have a sandbox, its state there and its last event",
		replay.FleetFind, func(x replay.Found) string { return x.ID }, table[replay.Found]{
			header: []string{"HOST", "ID", "HANDLE", "STATE", "LAST EVENT", "SEQ", "TIME"},
			row: func(x replay.Found) []string {
				return []string{x.Host, x.ID, x.Handle, x.State, string(x.Last.Type), fmt.Sprint(x.Last.Seq), x.Last.Time.UTC().Format(time.RFC3339)}
			},
		})
}

func fleetTimelineCmd() *cobra.Command {
	return fleetSandboxCmd("timeline ID|HANDLE", "Every event of a sandbox on every host that has it, each with its host",
		replay.FleetTimeline, func(e replay.FleetEntry) string { return e.ID }, table[replay.FleetEntry]{
			header: []string{"HOST", "SEQ", "TIME", "TYPE", "SAGA", "STEP", "DATA"},
			row: func(e replay.FleetEntry) []string {
				data, _ := json.Marshal(e.Payload)
				return []string{e.Host, fmt.Sprint(e.Seq), e.Time.UTC().Format("2006-01-02T15:04:05.000Z"), string(e.Type), e.Saga, e.Step, string(data)}
			},
		})
}

// fleetSandboxCmd is a fleet-wide read about one sandbox (an ID, or a
// handle on whichever hosts have it): read over the whole aggregate, its
// rows printed through the output layer.
func fleetSandboxCmd[T any](use, short string, read func(replay.FleetReader, string) ([]T, error), id func(T) string, t table[T]) *cobra.Command {
	var conn fleetConn
	var o *output
	c := &cobra.Command{
		Use: use, Short: short, Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := conn.dial(cmd)
			if err != nil {
				return err
			}
			defer f.Close()
			rows, err := read(fleetReader(cmd.Context(), f, fleet.Range{}), args[0])
			if err != nil {
				return err
			}
			return printList(cmd, o, rows, id, t)
		},
	}
	conn.flags(c)
	o = addOutput(c, true)
	return c
}
