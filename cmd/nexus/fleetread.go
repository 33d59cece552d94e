package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
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

// resolve takes the URL from $NEXUS_FLEET_URL when --nats is not given,
// or says which flag is missing (exit 2).
func (c *fleetConn) resolve(cmd *cobra.Command) error {
	if c.url == "" {
		c.url = os.Getenv("NEXUS_FLEET_URL")
	} else if strings.Contains(c.url, "@") {
		fmt.Fprintln(cmd.ErrOrStderr(), "nexus: warning: the fleet credentials are on the command line, readable in /proc/<pid>/cmdline: pass the URL in NEXUS_FLEET_URL or use --nats-creds")
	}
	if c.url == "" {
		return usageError{errors.New("name the fleet with --nats URL or NEXUS_FLEET_URL")}
	}
	return nil
}

// warnSkipped reports a record a fleet read skipped and went past.
func warnSkipped(cmd *cobra.Command, r fleetstate.Rejected) { warnSkippedTo(cmd.ErrOrStderr(), r) }

func warnSkippedTo(w io.Writer, r fleetstate.Rejected) {
	fmt.Fprintf(w, "nexus: warning: skipped %s\n", r)
}

// printFleetEvent prints each aggregate record as an event; one that does
// not decode is reported on errOut and the read goes on: one bad record
// must not hide every event after it.
func printFleetEvent(out, errOut io.Writer, o *output) func(replay.FleetRecord) error {
	p := newFleetPrinter(o)
	return func(rec replay.FleetRecord) error { return p.print(out, errOut, rec) }
}

// fleetPrinter prints records as printFleetEvent does, its decoder and
// buffers kept from one record to the next. A plain line is written from
// the record's payload transcoded to JSON (events.JSONDecoder), without
// the payload's Go value.
type fleetPrinter struct {
	o     *output
	plain bool
	line  []byte
	lines fleetLiner
}

func newFleetPrinter(o *output) *fleetPrinter {
	return &fleetPrinter{o: o, plain: !o.json && o.format == "" && !o.quiet}
}

func (p *fleetPrinter) print(out, errOut io.Writer, rec replay.FleetRecord) error {
	skip := func(err error) error {
		warnSkippedTo(errOut, fleetstate.Rejected{Stream: fleetstate.AggregateStream, Seq: rec.FleetSeq, Reason: err.Error()})
		return nil
	}
	if p.plain {
		e, err := p.lines.dec.Decode(rec.Data)
		if err != nil {
			return skip(rec.Unreadable(err))
		}
		// printStreamed's line, written without a string between.
		p.line = p.lines.append(p.line[:0], rec.FleetSeq, rec.Host, rec.Seq, e)
		_, err = out.Write(p.line)
		return err
	}
	e, err := replay.DecodeFleet(rec)
	if err != nil {
		return skip(err)
	}
	return printStreamed(out, p.o, e, e.ID, func() string { return fleetLine(e) })
}

func fleetAggregateCmd() *cobra.Command {
	var conn fleetConn
	var hosts []string
	var replicas int
	var keep bool
	c := &cobra.Command{
		Use:   "aggregate --host NAME [--host NAME...]",
		Short: "As the aggregator: create the fleet's aggregate stream (" + fleetstate.AggregateStream + ") from the hosts' mirrors, add hosts to it, and set its resume points; --keep keeps it current",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var names []string
			for _, h := range hosts {
				names = append(names, strings.Split(h, ",")...)
			}
			if len(names) == 0 {
				return usageError{errors.New("name at least one --host")}
			}
			return fleetAggregate(cmd, &conn, names, replicas, keep)
		},
	}
	conn.flags(c)
	c.Flags().StringArrayVar(&hosts, "host", nil, "a host name of the fleet (repeat, or separate with commas)")
	c.Flags().IntVar(&replicas, "replicas", 0, "replicas when created (0: 3 where the fleet has room, else 1)")
	c.Flags().BoolVar(&keep, "keep", false, "keep running: set sources that stall behind their mirrors up again (after an outage) and the resume points every minute, until interrupted")
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
			return fleetEvents(cmd, &conn, hosts, types, sandbox, since, follow, o)
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
	return strings.TrimSuffix(string(appendFleetLine(nil, e)), "\n")
}

// appendFleetLine appends e's line, newline included (fleetLiner).
func appendFleetLine(b []byte, e replay.FleetEntry) []byte {
	payload, err := json.Marshal(e.Payload)
	if err != nil {
		payload = nil
	}
	var l fleetLiner
	return l.append(b, e.FleetSeq, e.Host, e.Seq, &events.JSONEvent{Type: e.Type, Time: e.Time,
		Sandbox: []byte(e.Sandbox), Saga: []byte(e.Saga), Step: []byte(e.Step), Payload: payload})
}

// fleetLiner appends events' lines without fmt or a string per field, its
// decoder and its buffers kept from one line to the next: a whole read
// formats every event of the fleet.
type fleetLiner struct {
	dec events.JSONDecoder
}

// append appends the line of e, the event of the aggregate's record at
// fleetSeq from host's seq, newline included. Columns: fleet sequence,
// host, host sequence, time, type, sandbox, payload (JSON, as
// json.Marshal writes it), and the saga and step when the event has
// them.
func (l *fleetLiner) append(b []byte, fleetSeq uint64, host string, seq uint64, e *events.JSONEvent) []byte {
	b = appendNum(b, fleetSeq, 6)
	b = append(b, "  "...)
	b = appendLeft(b, host, 12)
	b = append(b, ' ')
	b = appendNum(b, seq, 6)
	b = append(b, "  "...)
	b = appendStamp(b, e.Time)
	b = append(b, "  "...)
	b = appendLeft(b, string(e.Type), 22)
	b = append(b, ' ')
	if len(e.Sandbox) == 0 {
		b = appendLeft(b, dash(""), 26)
	} else {
		b = appendLeftBytes(b, e.Sandbox, 26)
	}
	b = append(b, ' ')
	b = append(b, e.Payload...)
	if len(e.Saga) > 0 {
		b = append(b, "  saga="...)
		b = append(b, e.Saga...)
		b = append(b, " step="...)
		b = append(b, e.Step...)
	}
	return append(b, '\n')
}

// stampLayout is how a line spells an event's time.
const stampLayout = "2006-01-02T15:04:05.000Z"

// appendStamp appends t as t.AppendFormat(b, stampLayout) does (t's own
// zone's clock, the "Z" as written), without reading the layout for
// every event.
func appendStamp(b []byte, t time.Time) []byte {
	y, mo, d := t.Date()
	if y < 0 || y > 9999 {
		return t.AppendFormat(b, stampLayout)
	}
	h, mi, s := t.Clock()
	b = appendDigits(b, y, 4)
	b = append(b, '-')
	b = appendDigits(b, int(mo), 2)
	b = append(b, '-')
	b = appendDigits(b, d, 2)
	b = append(b, 'T')
	b = appendDigits(b, h, 2)
	b = append(b, ':')
	b = appendDigits(b, mi, 2)
	b = append(b, ':')
	b = appendDigits(b, s, 2)
	b = append(b, '.')
	b = appendDigits(b, t.Nanosecond()/1e6, 3)
	return append(b, 'Z')
}

// appendDigits appends the last width decimal digits of n (n >= 0),
// zero-padded.
func appendDigits(b []byte, n, width int) []byte {
	b = append(b, make([]byte, width)...)
	for i := len(b) - 1; i >= len(b)-width; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return b
}

// appendNum appends n right-aligned in width columns (fmt's %*d).
func appendNum(b []byte, n uint64, width int) []byte {
	var digits [20]byte
	d := strconv.AppendUint(digits[:0], n, 10)
	return append(appendSpaces(b, width-len(d)), d...)
}

// appendLeft appends s left-aligned in width columns (fmt's %-*s, which
// counts runes).
func appendLeft(b []byte, s string, width int) []byte {
	return appendSpaces(append(b, s...), width-utf8.RuneCountInString(s))
}

// appendLeftBytes is appendLeft of s's bytes.
func appendLeftBytes(b, s []byte, width int) []byte {
	return appendSpaces(append(b, s...), width-utf8.RuneCount(s))
}

// appendSpaces appends n spaces (none when n <= 0).
func appendSpaces(b []byte, n int) []byte {
	const spaces = "                                "
	for n > 0 {
		k := min(n, len(spaces))
		b = append(b, spaces[:k]...)
		n -= k
	}
	return b
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
			return fleetSandbox(cmd, &conn, o, read, id, t, args[0])
		},
	}
	conn.flags(c)
	o = addOutput(c, true)
	return c
}

// printFleetEventsOrdered prints what read yields as printFleetEvent
// does, decoding and formatting batches of records on every core while
// read goes on, and writing them in the order read yielded them: a
// whole read of the aggregate spends most of its time decoding and
// formatting, which one goroutine behind the read would leave to one
// core. It stops read at the first write or format error and returns
// it.
func printFleetEventsOrdered(out, errOut io.Writer, o *output, read func(func(replay.FleetRecord) error) error) error {
	const batchSize, firstBatch = 256, 16
	type batch struct {
		recs      []replay.FleetRecord
		out, errs bytes.Buffer
		err       error
		done      chan struct{} // one token when the batch is formatted
	}
	workers := runtime.GOMAXPROCS(0)
	jobs := make(chan *batch, workers)
	order := make(chan *batch, 2*workers)
	// A written batch is used again, its buffers with it: a fresh batch
	// each time would allocate and clear its output buffer every 256
	// events. A batch is made only when free is empty, so at most
	// 2*workers+2 exist (order's, the writer's, the one being filled):
	// free never blocks.
	free := make(chan *batch, 3*workers+3)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := newFleetPrinter(o)
			for b := range jobs {
				b.out.Grow(len(b.recs) * 192)
				for _, r := range b.recs {
					if b.err = p.print(&b.out, &b.errs, r); b.err != nil {
						break
					}
				}
				b.done <- struct{}{}
			}
		}()
	}
	// The writer waits for each batch in turn; after a failure it still
	// waits for every batch sent, so no worker is left blocked.
	failed := make(chan struct{})
	written := make(chan error, 1)
	go func() {
		var err error
		for b := range order {
			<-b.done
			if err == nil {
				if _, werr := writeSome(errOut, b.errs.Bytes()); werr != nil {
					err = werr
				} else if _, werr := writeSome(out, b.out.Bytes()); werr != nil {
					err = werr
				} else {
					err = b.err
				}
				if err != nil {
					close(failed)
				}
			}
			clear(b.recs) // no message kept alive by a batch waiting in free
			b.recs, b.err = b.recs[:0], nil
			b.out.Reset()
			b.errs.Reset()
			free <- b
		}
		written <- err
	}()
	var cur *batch
	send := func() {
		if cur != nil {
			order <- cur
			jobs <- cur
			cur = nil
		}
	}
	errFailed := errors.New("output failed")
	// The first batch is small, so the first lines are written as soon
	// as the first records are in, not after a full batch.
	size := firstBatch
	err := read(func(r replay.FleetRecord) error {
		select {
		case <-failed:
			return errFailed
		default:
		}
		if cur == nil {
			select {
			case cur = <-free:
			default:
				cur = &batch{recs: make([]replay.FleetRecord, 0, batchSize), done: make(chan struct{}, 1)}
			}
		}
		cur.recs = append(cur.recs, r)
		if len(cur.recs) == size {
			send()
			size = batchSize
		}
		return nil
	})
	send()
	close(order)
	close(jobs)
	wg.Wait()
	werr := <-written
	if werr != nil {
		return werr
	}
	return err
}

// writeSome writes p to w unless it is empty: a batch without a skipped
// record writes nothing to stderr, not an empty write for each batch.
func writeSome(w io.Writer, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return w.Write(p)
}
