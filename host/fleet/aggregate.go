package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/journal"
)

// AggregateStream is the fleet's aggregate: one stream in the auditors'
// account sourced from every host's mirror, so the fleet reads as one
// journal. No host name maps to it: MirrorStream never makes a '-'.
const AggregateStream = "NEXUS-FLEET"

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

// Auditor is an auditor's connection to the fleet: it keeps the aggregate
// and reads it. It never writes a host's mirror (the template lets it
// not), and every consumer it makes is ordered and ephemeral, gone when
// the read ends.
type Auditor struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	url string
}

// Dial connects as an auditor of `nexus fleet template`.
func Dial(natsURL, credsFile string) (*Auditor, error) {
	opts := []nats.Option{nats.Name("nexus fleet"), nats.Timeout(connectTimeout)}
	if credsFile != "" {
		opts = append(opts, nats.UserCredentials(credsFile))
	}
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("fleet: connect to %s: %w", RedactURL(natsURL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &Auditor{nc: nc, js: js, url: RedactURL(natsURL)}, nil
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
func (f *Auditor) EnsureAggregate(ctx context.Context, hosts []string, replicas int) (added []string, err error) {
	for _, h := range hosts {
		if err := ValidHostName(h); err != nil {
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
	have := map[string]bool{}
	for _, src := range cfg.Sources {
		have[src.Name] = true
	}
	for _, h := range hosts {
		if !have[MirrorStream(h)] {
			have[MirrorStream(h)] = true
			cfg.Sources = append(cfg.Sources, source(h))
			added = append(added, h)
		}
	}
	if len(added) == 0 {
		return nil, nil
	}
	if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
		return nil, fmt.Errorf("fleet: add %s to %s: %w", strings.Join(added, ", "), AggregateStream, err)
	}
	return added, nil
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
// ephemeral consumer.
func (f *Auditor) Scan(ctx context.Context, r journal.Range, fn func(Record) error) error {
	s, err := f.js.Stream(ctx, AggregateStream)
	if err != nil {
		return f.noAggregate(err)
	}
	// JetStream sources at least once: a source whose consumer restarts
	// (the aggregate extended under load, a node lost) can store a host's
	// record again (a host's first record twice, after the aggregate
	// gained that host as a source). A host's records arrive in its journal's
	// order, so one at or below the last yielded for its host is such a
	// copy, and each host record is yielded once.
	seen := hostSeqs{}
	return journal.ScanStream(ctx, s, r, func(rec journal.Record) error {
		host, _, _ := strings.Cut(rec.Subject, ".")
		seq := sourceSeq(rec.Source)
		if !seen.fresh(host, seq) {
			return nil
		}
		return fn(Record{Record: rec, Host: host, HostSeq: seq})
	})
}

// hostSeqs is the last host sequence yielded per host.
type hostSeqs map[string]uint64

// fresh says whether host's record at seq comes after the last one
// yielded (and records it); a record without a host sequence always does.
func (h hostSeqs) fresh(host string, seq uint64) bool {
	if seq == 0 {
		return true
	}
	if seq <= h[host] {
		return false
	}
	h[host] = seq
	return true
}

// sourceSeq is the sequence in a Nats-Stream-Source header ("<stream
// index> <seq> ..."), 0 if there is none.
func sourceSeq(h string) uint64 {
	fields := strings.Fields(h)
	if len(fields) < 2 {
		return 0
	}
	n, _ := strconv.ParseUint(fields[1], 10, 64)
	return n
}
