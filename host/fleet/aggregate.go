package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/host/fleetstate"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/journal"
)

// AggregateStream is the fleet's aggregate (fleetstate.AggregateStream).
const AggregateStream = fleetstate.AggregateStream

// aggregateDeliver is where a host account delivers its mirror's messages
// to the aggregate's source (exported to the auditors' account only).
func aggregateDeliver(host string) string { return "$NEXUS.AGG." + MirrorStream(host) }

// connectTimeout bounds an auditor's or a replay's connection handshake
// with the fleet: a busy fleet node can take more than the client's 2 s
// default to answer, and the command then fails for no fault of the fleet.
const connectTimeout = 15 * time.Second

// Range selects records of the aggregate by position, as a journal's
// reads do.
type Range = journal.Range

// Auditor is a connection to the fleet as one of the audit account's
// users of the template: the auditor reads the aggregate, the aggregator
// also keeps it (EnsureAggregate). It never writes a host's mirror (the
// template lets it not), and every consumer it makes is ordered and
// ephemeral, gone when the read ends.
type Auditor struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	url string
	// Reject gets every record a read skips (Rejected); nil drops them.
	Reject func(Rejected)
}

// Dial connects as an auditor of `nexus fleet template`.
func Dial(natsURL, credsFile string) (*Auditor, error) { return dial(natsURL, credsFile) }

func dial(natsURL, credsFile string, more ...nats.Option) (*Auditor, error) {
	opts := append([]nats.Option{nats.Name("nexus fleet"), nats.Timeout(connectTimeout)}, more...)
	if credsFile != "" {
		opts = append(opts, nats.UserCredentials(credsFile))
	}
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("fleet: connect to %s: %w", fleetstate.RedactURL(natsURL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &Auditor{nc: nc, js: js, url: fleetstate.RedactURL(natsURL)}, nil
}

// Close ends the connection.
func (f *Auditor) Close() { f.nc.Close() }

// AggregateSources are the hosts the aggregate is sourced from.
func (f *Auditor) AggregateSources(ctx context.Context) ([]string, error) {
	s, err := f.js.Stream(ctx, AggregateStream)
	if err != nil {
		return nil, f.noAggregate(err)
	}
	var hosts []string
	for _, src := range s.CachedInfo().Config.Sources {
		hosts = append(hosts, hostOfStream(src.Name))
	}
	slices.Sort(hosts)
	return hosts, nil
}

func (f *Auditor) noAggregate(err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("fleet: %s has no %s stream: create it with `nexus fleet aggregate --host NAME...`", f.url, AggregateStream)
	}
	return fmt.Errorf("fleet: %s at %s: %w", AggregateStream, f.url, err)
}

func hostOfStream(stream string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(stream, journal.StreamName+"_")), "_", "-")
}

// EnsureAggregate creates the aggregate sourced from hosts, or adds the
// hosts it lacks to an existing one; it never drops a source. replicas 0
// asks for 3 and takes 1 where the fleet cannot place 3. It returns the
// hosts it added.
//
// It also sets each source's resume point (its opt_start_seq) to the
// host sequence after the last the aggregate holds of that host. A source
// running on keeps its own position and ignores it; JetStream resumes
// from it only when the source stream proves re-created (a mirror deleted
// and made again), where it would otherwise source the host's whole
// journal again. So the aggregate holds each (host, host sequence) once
// across a re-creation as far as it held it when this last ran: run it
// after a repair's delete, or on a schedule; readers skip what is left.
func (f *Auditor) EnsureAggregate(ctx context.Context, hosts []string, replicas int) (added []string, err error) {
	for _, h := range hosts {
		if err := fleetstate.ValidHostName(h); err != nil {
			return nil, err
		}
	}
	source := func(h string) *jetstream.StreamSource {
		return &jetstream.StreamSource{Name: MirrorStream(h), External: &jetstream.ExternalStream{
			APIPrefix: AuditAPIPrefix, DeliverPrefix: aggregateDeliver(h)}}
	}
	s, err := f.js.Stream(ctx, AggregateStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		cfg := jetstream.StreamConfig{
			Name:        AggregateStream,
			Description: "nexus: every host's journal, sourced from the hosts' mirrors",
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
			AllowDirect: true,
			DenyDelete:  true,
			DenyPurge:   true,
		}
		for _, h := range hosts {
			cfg.Sources = append(cfg.Sources, source(h))
		}
		if cfg.Replicas == 0 {
			cfg.Replicas = 3
		}
		_, err = f.js.CreateStream(ctx, cfg)
		var api *jetstream.APIError
		if err != nil && replicas == 0 && errors.As(err, &api) && cannotPlace(api.ErrorCode) {
			cfg.Replicas = 1
			_, err = f.js.CreateStream(ctx, cfg)
		}
		if err != nil {
			return nil, fmt.Errorf("fleet: create %s: %w", AggregateStream, err)
		}
		return hosts, nil
	}
	if err != nil {
		return nil, f.noAggregate(err)
	}
	cfg := s.CachedInfo().Config
	changed := false
	have := map[string]bool{}
	for _, src := range cfg.Sources {
		have[src.Name] = true
		next, err := f.resumeAt(ctx, s, hostOfStream(src.Name))
		if err != nil {
			return nil, err
		}
		if next > src.OptStartSeq {
			src.OptStartSeq = next
			changed = true
		}
	}
	for _, h := range hosts {
		if !have[MirrorStream(h)] {
			have[MirrorStream(h)] = true
			cfg.Sources = append(cfg.Sources, source(h))
			added = append(added, h)
			changed = true
		}
	}
	if !changed {
		return nil, nil
	}
	if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
		if len(added) == 0 {
			return nil, fmt.Errorf("fleet: set the resume points of %s: %w", AggregateStream, err)
		}
		return nil, fmt.Errorf("fleet: add %s to %s: %w", strings.Join(added, ", "), AggregateStream, err)
	}
	return added, nil
}

// resumeAt is the host sequence after the last record of host the
// aggregate holds (0 when it holds none).
func (f *Auditor) resumeAt(ctx context.Context, s jetstream.Stream, host string) (uint64, error) {
	var m *jetstream.RawStreamMsg
	var err error
	// An aggregate just made answers gets only once its leader is
	// elected; until then no one responds.
	for try := 1; ; try++ {
		m, err = s.GetLastMsgForSubject(ctx, host+".>")
		if !errors.Is(err, nats.ErrNoResponders) || try == 25 {
			break
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("fleet: %s's last record of %s: %w", AggregateStream, host, err)
	}
	src, err := checkSource(m.Subject, m.Header.Get(sourceHeader))
	if err != nil {
		// Not a record of the host: no resume point from it.
		return 0, nil
	}
	return src.seq + 1, nil
}

// Record is one record of the aggregate: a host's record with its
// sequence in that host's journal.
type Record struct {
	journal.Record        // Seq is the aggregate's; Subject keeps the host prefix
	Host           string // the subject's first token
	// HostSeq is the record's sequence in its host's journal (the mirror
	// keeps the journal's), from the source header the aggregate adds.
	HostSeq uint64
}

// Scan reads the aggregate's records in r (its Filters are full subjects
// with the host token), in the aggregate's order, through one ordered
// ephemeral consumer. A record that does not match its source
// (checkSource) goes to Reject and the read goes on.
func (f *Auditor) Scan(ctx context.Context, r journal.Range, fn func(Record) error) error {
	s, err := f.js.Stream(ctx, AggregateStream)
	if err != nil {
		return f.noAggregate(err)
	}
	// JetStream sources at least once: a source whose consumer restarts
	// (the aggregate extended under load, a node lost, a mirror re-created
	// past its resume point) can store a host's record again. A host's
	// records arrive in its journal's order, so one at or below the last
	// yielded for its host is such a copy, and each host record is
	// yielded once.
	seen := hostSeqs{}
	check := sourceCheck{}
	return journal.ScanStream(ctx, s, r, func(rec journal.Record) error {
		src, err := check.check(rec.Subject, rec.Source)
		if err != nil {
			if f.Reject != nil {
				f.Reject(Rejected{Stream: AggregateStream, Seq: rec.Seq, Subject: rec.Subject, Reason: err.Error()})
			}
			return nil
		}
		if !seen.fresh(src.host, src.seq) {
			return nil
		}
		return fn(Record{Record: rec, Host: src.host, HostSeq: src.seq})
	})
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

// aggSource is where an aggregate record came from: its host and its
// sequence there.
type aggSource struct {
	host string
	seq  uint64
}

// checkSource checks an aggregate record against the Nats-Stream-Source
// header JetStream adds to each sourced record ("<stream>[:<api hash>]
// <seq> <filter> <destination> <original subject> [<identity>]"): the
// record must come from the mirror of the host its subject names, with a
// host sequence, under the subject it had there (the aggregate transforms
// none). Anything else was put there by other means than the sourcing.
func checkSource(subject, header string) (aggSource, error) {
	return sourceCheck(nil).check(subject, header)
}

// sourceCheck is checkSource with, for a read of many records, each
// valid host name it met and that host's mirror stream: checking a name
// and spelling its stream once per host, not per record.
type sourceCheck map[string]string

func (c sourceCheck) check(subject, header string) (aggSource, error) {
	host, _, _ := strings.Cut(subject, ".")
	mirror, known := c[host]
	if !known {
		if err := fleetstate.ValidHostName(host); err != nil {
			return aggSource{}, fmt.Errorf("subject names no host: %v", err)
		}
		mirror = MirrorStream(host)
		if c != nil {
			c[host] = mirror
		}
	}
	if header == "" {
		return aggSource{}, fmt.Errorf("no source: not sourced from a host's mirror")
	}
	f, ok := sourceFields(header)
	if !ok {
		return aggSource{}, fmt.Errorf("source %q: malformed", header)
	}
	stream, _, _ := strings.Cut(f[0], ":")
	if stream != mirror {
		return aggSource{}, fmt.Errorf("sourced from %s, but the subject names host %s", stream, host)
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil || seq == 0 {
		return aggSource{}, fmt.Errorf("source %q: no host sequence", header)
	}
	if f[4] != subject {
		return aggSource{}, fmt.Errorf("stored as %s, but %s holds it as %s", subject, stream, f[4])
	}
	return aggSource{host: host, seq: seq}, nil
}

// sourceFields are the first five space-separated fields of a source
// header; false when it has fewer.
func sourceFields(header string) (f [5]string, ok bool) {
	rest := header
	for i := range f {
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			return f, false
		}
		end := strings.IndexAny(rest, " \t")
		if end < 0 {
			end = len(rest)
		}
		f[i], rest = rest[:end], rest[end:]
	}
	return f, true
}

// sourceHeader is the header JetStream adds to each sourced record.
const sourceHeader = "Nats-Stream-Source"
