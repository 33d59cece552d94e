package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/host/fleetread"
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

// Range selects records of the aggregate by position, as a journal's
// reads do.
type Range = journal.Range

// Auditor is a connection to the fleet as one of the audit account's
// users of the template: the auditor reads the aggregate
// (fleetread.Reader), the aggregator also keeps it (EnsureAggregate). It
// never writes a host's mirror (the template lets it not).
type Auditor struct {
	*fleetread.Reader
	nc  *nats.Conn
	js  jetstream.JetStream
	url string
}

// Dial connects as an auditor of `nexus fleet template`.
func Dial(natsURL, credsFile string) (*Auditor, error) { return dial(natsURL, credsFile) }

func dial(natsURL, credsFile string, more ...nats.Option) (*Auditor, error) {
	r, err := fleetread.Dial(natsURL, credsFile, more...)
	if err != nil {
		return nil, err
	}
	return &Auditor{Reader: r, nc: r.Conn(), js: r.JetStream(), url: r.URL()}, nil
}

// AggregateSources are the hosts the aggregate is sourced from.
func (f *Auditor) AggregateSources(ctx context.Context) ([]string, error) {
	s, err := f.js.Stream(ctx, AggregateStream)
	if err != nil {
		return nil, f.NoAggregate(err)
	}
	var hosts []string
	for _, src := range s.CachedInfo().Config.Sources {
		hosts = append(hosts, hostOfStream(src.Name))
	}
	slices.Sort(hosts)
	return hosts, nil
}

func hostOfStream(stream string) string {
	host, _ := fleetstate.HostOfMirror(stream)
	return host
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
			Duplicates:  aggregateDuplicates,
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
		return nil, f.NoAggregate(err)
	}
	cfg := s.CachedInfo().Config
	changed := false
	if cfg.Duplicates < aggregateDuplicates {
		cfg.Duplicates = aggregateDuplicates
		changed = true
	}
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

// aggregateDuplicates is the aggregate's de-duplication window. JetStream
// sources at least once: a source set up again (a leader change, the
// aggregate extended) can deliver records the aggregate already stored.
// Each carries its journal event's ID (Nats-Msg-Id), so a copy arriving
// within the window is not stored; an older one is skipped by every
// fleet read (fleetread.Reader.Scan).
const aggregateDuplicates = 2 * time.Minute

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
	src, err := fleetread.CheckSource(m.Subject, m.Header.Get(fleetread.SourceHeader))
	if err != nil {
		// Not a record of the host: no resume point from it.
		return 0, nil
	}
	return src.Seq + 1, nil
}

// Record is one record of the aggregate (fleetread.Record).
type Record = fleetread.Record

// connectTimeout bounds a connection's handshake with the fleet
// (fleetread.ConnectTimeout).
const connectTimeout = fleetread.ConnectTimeout
