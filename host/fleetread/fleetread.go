// Package fleetread reads the fleet's aggregate as an auditor of `nexus
// fleet template`, each record checked against the mirror it was sourced
// from, over the NATS client alone: the CLI reads the fleet without
// linking the embedded server or the fleet adapter (host/fleet), which
// builds on it.
package fleetread

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/host/streamscan"
)

// ConnectTimeout bounds an auditor's or a replay's connection handshake
// with the fleet: a busy fleet node can take more than the client's 2 s
// default to answer, and the command then fails for no fault of the fleet.
const ConnectTimeout = 15 * time.Second

// Connect connects to the fleet as one of `nexus fleet template`'s
// users, with credsFile when given; its error names the URL without a
// password.
func Connect(natsURL, credsFile string, more ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{nats.Name("nexus fleet"), nats.Timeout(ConnectTimeout)}, more...)
	if credsFile != "" {
		opts = append(opts, nats.UserCredentials(credsFile))
	}
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("fleet: connect to %s: %w", fleetstate.RedactURL(natsURL), err)
	}
	return nc, nil
}

// Range selects records of the aggregate by position (streamscan.Range).
type Range = streamscan.Range

// Reader is a connection to the fleet as an auditor. Every consumer it
// makes is ordered and ephemeral, gone when the read ends.
type Reader struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	url string
	// Reject gets every record a read skips (fleetstate.Rejected); nil
	// drops them.
	Reject func(fleetstate.Rejected)
}

// Dial connects as an auditor.
func Dial(natsURL, credsFile string, more ...nats.Option) (*Reader, error) {
	nc, err := Connect(natsURL, credsFile, more...)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &Reader{nc: nc, js: js, url: fleetstate.RedactURL(natsURL)}, nil
}

// Close ends the connection.
func (f *Reader) Close() { f.nc.Close() }

// Conn, JetStream and URL are the reader's connection, its JetStream
// context and its URL without a password.
func (f *Reader) Conn() *nats.Conn               { return f.nc }
func (f *Reader) JetStream() jetstream.JetStream { return f.js }
func (f *Reader) URL() string                    { return f.url }

// NoAggregate explains err from looking up the aggregate: a missing one
// says how to create it.
func (f *Reader) NoAggregate(err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("fleet: %s has no %s stream: create it with `nexus fleet aggregate --host NAME...`", f.url, fleetstate.AggregateStream)
	}
	return fmt.Errorf("fleet: %s at %s: %w", fleetstate.AggregateStream, f.url, err)
}

// Record is one record of the aggregate: a host's record with its
// sequence in that host's journal.
type Record struct {
	streamscan.Record        // Seq is the aggregate's; Subject keeps the host prefix
	Host              string // the subject's first token
	// HostSeq is the record's sequence in its host's journal (the mirror
	// keeps the journal's), from the source header the aggregate adds.
	HostSeq uint64
}

// Scan reads the aggregate's records in r (its Filters are full subjects
// with the host token), in the aggregate's order, through one ordered
// ephemeral consumer. A record that does not match its source
// (CheckSource) goes to Reject and the read goes on.
func (f *Reader) Scan(ctx context.Context, r Range, fn func(Record) error) error {
	s, err := f.js.Stream(ctx, fleetstate.AggregateStream)
	if err != nil {
		return f.NoAggregate(err)
	}
	// JetStream sources at least once: a source whose consumer restarts
	// (the aggregate extended under load, a node lost, a mirror re-created
	// past its resume point) can store a host's record again. A host's
	// records arrive in its journal's order, so one at or below the last
	// yielded for its host is such a copy, and each host record is
	// yielded once.
	seen := hostSeqs{}
	check := sourceCheck{}
	if !r.FromTime.IsZero() {
		at, err := streamscan.SeqAt(ctx, s, r.FromTime)
		if err != nil {
			return err
		}
		r.From, r.FromTime = max(r.From, at), time.Time{}
	}
	if r.From > 1 && r.Tail == 0 {
		seenBefore(ctx, s, r.From, check, seen)
	}
	return streamscan.ScanLooked(ctx, s, r, func(rec streamscan.Record) error {
		src, err := check.check(rec.Subject, rec.Source)
		if err != nil {
			if f.Reject != nil {
				f.Reject(fleetstate.Rejected{Stream: fleetstate.AggregateStream, Seq: rec.Seq, Subject: rec.Subject, Reason: err.Error()})
			}
			return nil
		}
		if !seen.fresh(src.Host, src.Seq) {
			return nil
		}
		return fn(Record{Record: rec, Host: src.Host, HostSeq: src.Seq})
	})
}

// seenBefore notes in seen, for each host the aggregate sources, the host
// sequence of its last record before position from: a read from there on
// (a follow from the end, --since) then skips the copies stored later of
// what came before it, as a read from the start does. A failed lookup
// notes nothing for its host, whose read yields what it would have.
func seenBefore(ctx context.Context, s jetstream.Stream, from uint64, check sourceCheck, seen hostSeqs) {
	for _, src := range s.CachedInfo().Config.Sources {
		host, ok := fleetstate.HostOfMirror(src.Name)
		if !ok || seen[host] != 0 {
			continue
		}
		m, err := lastBefore(ctx, s, host+".>", from)
		if err != nil || m == nil {
			continue
		}
		if got, err := check.check(m.Subject, m.Header.Get(SourceHeader)); err == nil && got.Host == host {
			seen[host] = got.Seq
		}
	}
}

// lastBefore is the last record under subject filter subj stored before
// position from (nil when there is none), found by bisecting lookups of
// the next record under subj at a position: O(log from) requests,
// however long ago the filter's last record came.
func lastBefore(ctx context.Context, s jetstream.Stream, subj string, from uint64) (*jetstream.RawStreamMsg, error) {
	next := func(seq uint64) (*jetstream.RawStreamMsg, error) {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil
		}
		return m, err
	}
	last, err := next(1)
	if err != nil || last == nil || last.Sequence >= from {
		return nil, err
	}
	// last is the latest record under subj found before from: none lies
	// in [last+1, lo), nor in [hi+1, from).
	lo, hi := last.Sequence+1, from-1
	for lo <= hi {
		mid := lo + (hi-lo)/2
		m, err := next(mid)
		switch {
		case err != nil:
			return nil, err
		case m == nil || m.Sequence >= from:
			hi = mid - 1
		default:
			last, lo = m, m.Sequence+1
		}
	}
	return last, nil
}

// hostSeqs is the last host sequence yielded per host.
type hostSeqs map[string]uint64

// fresh says whether host's record at seq comes after the last one
// yielded (and records it).
func (h hostSeqs) fresh(host string, seq uint64) bool {
	if seq <= h[host] {
		return false
	}
	h[host] = seq
	return true
}

// Source is where an aggregate record came from: its host and its
// sequence there.
type Source struct {
	Host string
	Seq  uint64
}

// SourceHeader is the header JetStream adds to each sourced record.
const SourceHeader = "Nats-Stream-Source"

// CheckSource checks an aggregate record against the Nats-Stream-Source
// header JetStream adds to each sourced record ("<stream>[:<api hash>]
// <seq> <filter> <destination> <original subject> [<identity>]"): the
// record must come from the mirror of the host its subject names, with a
// host sequence, under the subject it had there (the aggregate transforms
// none). Anything else was put there by other means than the sourcing.
func CheckSource(subject, header string) (Source, error) {
	return sourceCheck(nil).check(subject, header)
}

// sourceCheck is CheckSource with, for a read of many records, each
// valid host name it met and that host's mirror stream: checking a name
// and spelling its stream once per host, not per record.
type sourceCheck map[string]string

func (c sourceCheck) check(subject, header string) (Source, error) {
	host, _, _ := strings.Cut(subject, ".")
	mirror, known := c[host]
	if !known {
		if err := fleetstate.ValidHostName(host); err != nil {
			return Source{}, fmt.Errorf("subject names no host: %v", err)
		}
		mirror = fleetstate.MirrorStream(host)
		if c != nil {
			c[host] = mirror
		}
	}
	if header == "" {
		return Source{}, fmt.Errorf("no source: not sourced from a host's mirror")
	}
	f, ok := sourceFields(header)
	if !ok {
		return Source{}, fmt.Errorf("source %q: malformed", header)
	}
	stream, _, _ := strings.Cut(f[0], ":")
	if stream != mirror {
		return Source{}, fmt.Errorf("sourced from %s, but the subject names host %s", stream, host)
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil || seq == 0 {
		return Source{}, fmt.Errorf("source %q: no host sequence", header)
	}
	if f[4] != subject {
		return Source{}, fmt.Errorf("stored as %s, but %s holds it as %s", subject, stream, f[4])
	}
	return Source{Host: host, Seq: seq}, nil
}

// sourceFields are the first five space-separated fields of a source
// header (spaces and tabs); false when it has fewer.
func sourceFields(header string) (f [5]string, ok bool) {
	i := 0
	for k := range f {
		for i < len(header) && (header[i] == ' ' || header[i] == '\t') {
			i++
		}
		if i == len(header) {
			return f, false
		}
		start := i
		for i < len(header) && header[i] != ' ' && header[i] != '\t' {
			i++
		}
		f[k] = header[start:i]
	}
	return f, true
}
