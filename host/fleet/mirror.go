// Package fleet is a host's part in a fleet's NATS JetStream: the mirror
// of its journal there (through the journal's leaf-node link), the
// fleet's permission template, and the auditors' reads of the mirrors and
// their aggregate.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/host/streamscan"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
)

// Mirror configures replication of the journal to a stream on an existing
// NATS JetStream deployment (the fleet's audit store), so one place holds
// the events of many hosts.
//
// A Mirror given to journal.Open (Options.Mirror) keeps the mirror for that
// journal (journal.LeafMirror), as an http.Server holds its settings and serves:
// it is used through a pointer and serves one journal at a time.
//
// It is JetStream's own mirroring, not a copier: the embedded server joins
// the fleet as a leaf node in its own JetStream domain, and a mirror stream
// created on the fleet side pulls from the journal through that link. The
// fleet keeps its position, so events appended while the link is down
// arrive, in order and once each, when it is back.
type Mirror struct {
	// URLs are the fleet's leaf-node endpoints (nats-leaf://, nats:// or
	// tls://), with user:password in them if the fleet wants them; the link
	// tries each in turn, so one node down at start does not keep it down.
	URLs []*url.URL
	// Credentials is a NATS .creds file for the link, or "".
	Credentials string
	// Domain is the fleet's JetStream domain, where the mirror stream is made.
	Domain string
	// Host names this host (ValidHostName): the mirror stream is
	// "NEXUS_<HOST>" and every mirrored subject is prefixed "<host>.".
	Host string
	// HostID is the host's identity (host/hostid). It names the embedded
	// server and its JetStream domain, so two hosts never pass for one on
	// the fleet, and it is stored in the mirror's metadata, so a second
	// host with the same name is refused rather than interleaved.
	HostID string
	// Replicas of the mirror when nexus creates it; 0 asks for 3 and takes
	// 1 when the fleet cannot place 3.
	Replicas int
	// MaxBytes limits the mirror when nexus creates it; 0 is no limit.
	MaxBytes int64
	// Check spaces checks that the mirror still exists (it is re-created
	// if it was deleted); 0 means 30 s.
	Check time.Duration
	// StartWait bounds how long Open waits for the fleet's first answer;
	// 0 means 5 s. A refusal within it fails Open; a fleet that does not
	// answer in time is retried in the background.
	StartWait time.Duration

	mu  sync.Mutex
	cur *run
	// chain is the mirror's digest chain as far as the last status read
	// it: a status reads only the records the mirror gained since.
	chain chainCache
}

// ErrHostTaken is a mirror stream on the fleet that belongs to another
// host identity: mirroring into it would interleave two journals.
var ErrHostTaken = errors.New("fleet: mirror stream belongs to another host")

// metaHostID and metaHost are the mirror stream's metadata keys.
const (
	metaHostID = "nexus_host_id"
	metaHost   = "nexus_host"
)

var (
	hostToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

func (m *Mirror) validate() error {
	if len(m.URLs) == 0 {
		return errors.New("fleet: mirror needs a fleet URL")
	}
	for _, u := range m.URLs {
		if err := fleetstate.CheckURL(u); err != nil {
			return err
		}
	}
	if err := fleetstate.ValidHostName(m.Host); err != nil {
		return fmt.Errorf("fleet: mirror %w", err)
	}
	if _, err := ulid.ParseStrict(m.HostID); err != nil {
		return fmt.Errorf("fleet: mirror host identity %q: %v", m.HostID, err)
	}
	if !hostToken.MatchString(m.Domain) {
		return fmt.Errorf("fleet: mirror domain %q: want 1-64 letters, digits, '-' or '_'", m.Domain)
	}
	if m.Replicas < 0 || m.Replicas > 5 {
		return fmt.Errorf("fleet: mirror replicas %d: want 1-5 (0 for 3 where the fleet has room)", m.Replicas)
	}
	if m.Credentials != "" {
		// The server only logs an unreadable creds file, and then never
		// links: the daemon would say "mirroring" and mirror nothing.
		data, err := os.ReadFile(m.Credentials)
		if err != nil {
			return fmt.Errorf("fleet: mirror credentials: %w", err)
		}
		if !strings.Contains(string(data), "BEGIN NATS USER JWT") {
			return fmt.Errorf("fleet: mirror credentials %s: not a NATS .creds file", m.Credentials)
		}
	}
	return nil
}

// Redacted lists the fleet URLs without passwords, for logs and status.
func (m *Mirror) Redacted() []string {
	out := make([]string, len(m.URLs))
	for i, u := range m.URLs {
		out[i] = u.Redacted()
	}
	return out
}

// identity is lower-case so it is a valid domain and server name.
func (m *Mirror) identity() string { return strings.ToLower(m.HostID) }

// localDomain is the embedded server's JetStream domain: from the
// identity, so the fleet's consumer requests for one host's journal can
// only ever reach that host.
func (m *Mirror) localDomain() string { return "nexus-" + m.identity() }

// serverName is distinct per host: a hub treats two leaf links with one
// server name as one server reconnecting and drops the older.
func (m *Mirror) serverName() string { return "nexus-" + m.Host + "-" + m.identity() }

// StreamName is the mirror stream's name on the fleet.
func (m *Mirror) StreamName() string { return MirrorStream(m.Host) }

// MirrorStream is the fleet stream a valid host name mirrors into
// (fleetstate.MirrorStream).
func MirrorStream(host string) string { return fleetstate.MirrorStream(host) }

// Leaf is the journal's link to the fleet: its server and JetStream
// domain named by the host identity.
func (m *Mirror) Leaf() (journal.Leaf, error) {
	if err := m.validate(); err != nil {
		return journal.Leaf{}, err
	}
	return journal.Leaf{ServerName: m.serverName(), Domain: m.localDomain(), URLs: m.URLs, Credentials: m.Credentials}, nil
}

// run is a Mirror's state while it serves one journal, from Start on.
type run struct {
	link    journal.Linked
	stop    context.CancelFunc
	changes chan MirrorChange // feeds Changes
	// refused is closed once the fleet's mirror proves to be another
	// host's; refusal is why (Refused).
	refused chan struct{}

	mu      sync.Mutex
	refusal error
	err     error
	set     bool
	// seen: the mirror existed once, so a create is a re-create.
	// creating: a create was sent and not confirmed (its reply may be
	// lost while the fleet made the stream).
	// drift: how the fleet's mirror differs from the settings.
	seen     bool
	creating bool
	drift    string
	// reported is the journal sequence this run last reported.
	reported     uint64
	reportedOnce bool
}

// Start keeps the mirror from now until Stop (journal.LeafMirror), afresh for
// each journal it is given to. It waits up to StartWait for the fleet's
// first answer: a refusal in that time is its error, as one line; one
// found later is Refused's to deliver.
func (m *Mirror) Start(ctx context.Context, l journal.Linked) error {
	mctx, stop := context.WithCancel(context.Background())
	r := &run{link: l, stop: stop, changes: make(chan MirrorChange, mirrorChangeBuffer), refused: make(chan struct{})}
	m.mu.Lock()
	m.cur = r
	m.mu.Unlock()
	first := make(chan error, 1)
	go m.keep(mctx, r, first)
	go m.watchLink(mctx, r)
	wait := m.StartWait
	if wait <= 0 {
		wait = 5 * time.Second
	}
	select {
	case <-r.refused:
		_, err := m.Refused()
		return err
	case err := <-first:
		if refusedAccount(err) {
			return err
		}
	case <-l.Refused:
		return fmt.Errorf("fleet: the fleet refused this host's link credentials (authorization violation) at %s", strings.Join(m.Redacted(), ", "))
	case <-time.After(wait):
		l.Log.Warn("mirror.pending", "stream", m.StreamName(), "reason", "the fleet has not answered yet; retrying in the background")
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// Stop ends the mirroring (journal.LeafMirror); the journal's Close calls it.
func (m *Mirror) Stop() {
	if r := m.current(); r != nil {
		r.stop()
	}
}

// current is the run of the journal the Mirror serves (nil before Start).
func (m *Mirror) current() *run {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur
}

// mirrorRetry spaces attempts to create the mirror stream while the fleet
// is unreachable.
const mirrorRetry = 2 * time.Second

// keep makes sure the mirror stream exists on the fleet until ctx
// ends: created when missing (again if someone deleted it), refused for
// good when it belongs to another host. first gets the first verdict.
func (m *Mirror) keep(ctx context.Context, r *run, first chan<- error) {
	fleet, err := jetstream.NewWithDomain(r.link.Conn, m.Domain)
	if err != nil {
		r.setErr(err)
		first <- err
		return
	}
	every := m.Check
	if every <= 0 {
		every = 30 * time.Second
	}
	told := false
	for {
		err := m.ensure(ctx, r, fleet)
		r.setErr(err)
		if errors.Is(err, ErrHostTaken) {
			m.refuse(r, err)
			return
		}
		if !told && (err == nil || refusedAccount(err)) {
			first <- err
			told = true
		}
		wait := every
		if err != nil {
			wait = mirrorRetry
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// ensure is one check of the mirror on the fleet. It creates a
// missing mirror with the settings, and never rewrites one that exists (a
// host may not: the fleet's operator changes replicas or limits, and a
// difference from the settings is logged and reported).
func (m *Mirror) ensure(ctx context.Context, r *run, fleet jetstream.JetStream) error {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := fleet.Stream(actx, m.StreamName())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return m.create(actx, r, fleet)
	}
	if err != nil {
		return fmt.Errorf("mirror %s: %w", m.StreamName(), err)
	}
	cfg := s.CachedInfo().Config
	if err := m.owns(cfg); err != nil {
		return err
	}
	r.mu.Lock()
	pending := r.creating
	r.seen = r.seen || !pending
	r.mu.Unlock()
	if pending {
		// This host's own create, whose answer did not come back.
		m.made(r, cfg.Replicas)
	}
	var drift []string
	if m.Replicas > 0 && cfg.Replicas != m.Replicas {
		drift = append(drift, fmt.Sprintf("replicas %d (nexus asks %d)", cfg.Replicas, m.Replicas))
	}
	if want := maxBytes(m.MaxBytes); cfg.MaxBytes != want {
		drift = append(drift, fmt.Sprintf("max bytes %d (nexus asks %d)", cfg.MaxBytes, want))
	}
	d := strings.Join(drift, ", ")
	r.mu.Lock()
	changed := d != r.drift
	r.drift = d
	r.mu.Unlock()
	if changed && d != "" {
		r.link.Log.Warn("mirror.settings-differ", "stream", m.StreamName(), "kept", d)
		m.reportChange(r, MirrorChange{Kind: "settings_differ", Detail: d, Replicas: cfg.Replicas})
	}
	// The report is for auditors; failing it (an account out of streams)
	// leaves the mirror itself healthy, so it is logged, not returned.
	if err := m.report(actx, r, fleet, cfg.Replicas); err != nil {
		r.link.Log.Warn("mirror.report-failed", "stream", m.StreamName(), "err", err)
	}
	return nil
}

// ReportSubject is where a host publishes its report, in its own account
// (the template lets only that host's link publish there).
const ReportSubject = "$NEXUS.REPORT"

// ReportStream keeps a host's last report, next to its mirror in the
// host's account. The '-' keeps it apart from every MirrorStream.
func ReportStream(host string) string {
	return "NEXUS-REPORT_" + strings.TrimPrefix(MirrorStream(host), journal.StreamName+"_")
}

// reportMaxBytes bounds the report stream: it keeps one small message.
const reportMaxBytes = 64 << 10

// HostReport is a host's word on its journal: the last sequence it held
// and when, published to its report stream, which only that host
// publishes to and auditors read; a mirror shorter than that word is seen
// without asking the host. It lives outside the mirror's configuration because a
// host may not update its mirror.
type HostReport struct {
	HostID   string    `json:"host_id"`
	LastSeq  uint64    `json:"last_seq"`
	Reported time.Time `json:"reported"`
	// DigestSeq and Digest are the host's last journal.digest then: its
	// journal's records 1 to DigestSeq hash to Digest (0: none yet).
	DigestSeq uint64 `json:"digest_seq,omitempty"`
	Digest    string `json:"digest,omitempty"`
}

// report publishes the journal's last sequence to the report stream
// (made when missing) when it moved since this run last published it.
func (m *Mirror) report(ctx context.Context, r *run, fleet jetstream.JetStream, replicas int) error {
	last, err := r.link.Journal.LastSeq(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	done := r.reported == last && r.reportedOnce
	r.mu.Unlock()
	if done {
		return nil
	}
	name := ReportStream(m.Host)
	if _, err := fleet.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = fleet.CreateStream(ctx, jetstream.StreamConfig{
			Name:              name,
			Description:       fmt.Sprintf("nexus: host %s's last report of its journal", m.Host),
			Subjects:          []string{ReportSubject},
			Storage:           jetstream.FileStorage,
			Replicas:          replicas,
			MaxMsgsPerSubject: 1,
			MaxBytes:          reportMaxBytes,
			DenyDelete:        true,
			DenyPurge:         true,
		})
		if err != nil {
			return fmt.Errorf("report %s: create: %w", name, err)
		}
	} else if err != nil {
		return fmt.Errorf("report %s: %w", name, err)
	}
	d, err := lastDigest(ctx, r.link.Journal)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(HostReport{HostID: m.HostID, LastSeq: last, Reported: time.Now().UTC(), DigestSeq: d.Seq, Digest: d.Digest})
	// A stream just made takes a moment to reach the link as interest in
	// its subject; until then a publish finds no stream to answer it.
	for try := 1; ; try++ {
		_, err := fleet.Publish(ctx, ReportSubject, data)
		if err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrNoStreamResponse) || try == 10 {
			return fmt.Errorf("report %s: journal sequence %d: %w", name, last, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	r.mu.Lock()
	r.reported, r.reportedOnce = last, true
	r.mu.Unlock()
	return nil
}

// streamGetter is a stream lookup: jetstream.JetStream, or a caller's
// own view of one.
type streamGetter interface {
	Stream(ctx context.Context, name string) (jetstream.Stream, error)
}

// readReport is host's last report (zero when it never made one). A
// report naming another host identity than the mirror's is not this
// mirror's host's word, and is an error.
func readReport(ctx context.Context, js streamGetter, host, hostID string) (HostReport, error) {
	var rep HostReport
	s, err := js.Stream(ctx, ReportStream(host))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("report %s: %w", ReportStream(host), err)
	}
	msg, err := s.GetLastMsgForSubject(ctx, ReportSubject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("report %s: %w", ReportStream(host), err)
	}
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return HostReport{}, fmt.Errorf("report %s: undecodable: %w", ReportStream(host), err)
	}
	if hostID != "" && rep.HostID != hostID {
		return HostReport{}, fmt.Errorf("report %s is from host identity %s, the mirror's is %s", ReportStream(host), rep.HostID, hostID)
	}
	return rep, nil
}

func maxBytes(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// owns checks an existing stream was made by this host identity.
func (m *Mirror) owns(cfg jetstream.StreamConfig) error {
	id := cfg.Metadata[metaHostID]
	switch {
	case id == "":
		return fmt.Errorf("%w: %s exists on the fleet without a host identity (made by hand or an older nexus); delete it there or choose another host name", ErrHostTaken, cfg.Name)
	case id != m.HostID:
		return fmt.Errorf("%w: %s is the mirror of host %q with identity %s, not this host (%s); choose another host name", ErrHostTaken, cfg.Name, cfg.Metadata[metaHost], id, m.HostID)
	}
	return nil
}

// create makes the mirror stream. Replicas 0 asks for 3 and falls
// back to 1 only when the fleet says it cannot place them.
func (m *Mirror) create(ctx context.Context, r *run, fleet jetstream.JetStream) error {
	cfg := jetstream.StreamConfig{
		Name:        m.StreamName(),
		Description: fmt.Sprintf("nexus journal of host %s (%s)", m.Host, m.HostID),
		Storage:     jetstream.FileStorage,
		Replicas:    m.Replicas,
		MaxBytes:    maxBytes(m.MaxBytes),
		Mirror: &jetstream.StreamSource{
			Name:              journal.StreamName,
			Domain:            m.localDomain(),
			SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: ">", Destination: m.Host + ".>"}},
		},
		DenyDelete: true,
		DenyPurge:  true,
		Metadata:   map[string]string{metaHostID: m.HostID, metaHost: m.Host},
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	r.mu.Lock()
	r.creating = true
	r.mu.Unlock()
	_, err := fleet.CreateStream(ctx, cfg)
	var api *jetstream.APIError
	if err != nil && m.Replicas == 0 && errors.As(err, &api) && cannotPlace(api.ErrorCode) {
		cfg.Replicas = 1
		_, err = fleet.CreateStream(ctx, cfg)
	}
	if err != nil {
		return fmt.Errorf("mirror %s: create: %w", m.StreamName(), err)
	}
	m.made(r, cfg.Replicas)
	return nil
}

// made logs and reports the mirror this host made: created, or recreated
// when it had seen one before.
func (m *Mirror) made(r *run, replicas int) {
	r.mu.Lock()
	seen := r.seen
	r.seen, r.creating = true, false
	r.mu.Unlock()
	kind := "created"
	if seen {
		kind = "recreated"
	}
	r.link.Log.Info("mirror."+kind, "stream", m.StreamName(), "replicas", replicas, "domain", m.Domain)
	m.reportChange(r, MirrorChange{Kind: kind, Replicas: replicas})
}

// refusedAccount: the fleet's account cannot hold the mirror as asked
// (no JetStream, a byte limit required, no streams or storage left): a
// misconfiguration Open reports rather than retries in silence.
func refusedAccount(err error) bool {
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		return false
	}
	switch api.ErrorCode {
	case 10039, 10113, 10027, 10047: // not enabled, max bytes required, stream limit, storage exceeded
		return true
	}
	return false
}

// cannotPlace: the fleet has too few servers (or is not clustered) for
// the replicas asked.
func cannotPlace(code jetstream.ErrorCode) bool {
	switch code {
	case 10074, 10023, 10005: // replicas not supported, insufficient resources, no peers
		return true
	}
	return false
}

// watchLink logs the leaf link going up and down, and reports changes
// (linkLimiter) for the journal.
func (m *Mirror) watchLink(ctx context.Context, r *run) {
	up := false
	lim := linkLimiter{quiet: linkQuiet}
	for {
		now := r.link.Up()
		if report, flaps := lim.observe(time.Now(), now); report {
			kind := "unlinked"
			if now {
				kind = "linked"
			}
			m.reportChange(r, MirrorChange{Kind: kind, URLs: m.Redacted(), Flaps: flaps})
		}
		if now != up {
			up = now
			if up {
				r.link.Log.Info("mirror.linked", "urls", strings.Join(m.Redacted(), ","))
			} else {
				r.link.Log.Warn("mirror.unlinked", "urls", strings.Join(m.Redacted(), ","))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// refuse ends this host's claim to its name: the fleet's stream of that
// name is another host's. Whenever that is found (before Open returns or
// long after), it is final and delivered the same way, through
// Refused: a host that went on would serve under a name whose audit
// copy is another's, and a second found while the fleet was slow would
// otherwise outlive the refusal a quick fleet gives at start.
func (m *Mirror) refuse(r *run, err error) {
	r.mu.Lock()
	r.refusal = err
	r.mu.Unlock()
	m.reportChange(r, MirrorChange{Kind: "refused", Detail: err.Error()})
	close(r.refused)
}

// Refused is closed once the fleet's mirror stream proves to belong to
// another host (ErrHostTaken), however long after Open that is found; err
// then says whose it is. Mirroring stops, and the journal's owner must
// stop acting as this host (the daemon exits with err). Before Start the
// channel is nil: it never fires.
func (m *Mirror) Refused() (refused <-chan struct{}, err error) {
	r := m.current()
	if r == nil {
		return nil, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused, r.refusal
}

func (r *run) setErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err, r.set = err, true
}

// Status reports whether the mirror stream exists on the fleet yet: ok
// once created; otherwise the last error ("" before the first attempt).
func (m *Mirror) Status() (ok bool, lastErr string) {
	r := m.current()
	if r == nil {
		return false, ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return false, r.err.Error()
	}
	return r.set, ""
}

// Rejected is a record a read skipped (fleetstate.Rejected).
type Rejected = fleetstate.Rejected

// ReadMirror reads every record of a mirror stream on the fleet (or any
// JetStream holding nexus events) at natsURL, in order, for replay. It only
// reads: an ordered consumer, or, with apiPrefix (an auditor of the fleet
// template, allowed stream info and get only), each message by sequence;
// nothing is acknowledged or deleted. Subjects keep the mirror's host
// prefix; a record whose subject is not the host's is given to reject
// (nil: dropped) and the read goes on. An empty mirror, or one whose first
// sequence is not 1, is an error: a journal starts at 1 and never loses
// its head, so either means the audit copy is not the journal; so is one
// that ends before the last sequence its host reported (ReportStream), and
// one whose records up to the host's reported digest hash to another
// (found once they are read). Each refusal is ErrMirrorCheck and names the
// check that failed (CheckFirstSeq, CheckCount, CheckLastSeq, CheckDigest).
func ReadMirror(ctx context.Context, natsURL, credsFile, apiPrefix, stream string, fn func(journal.Record) error, reject func(Rejected)) error {
	opts := []nats.Option{nats.Name("nexus replay"), nats.Timeout(connectTimeout)}
	if credsFile != "" {
		opts = append(opts, nats.UserCredentials(credsFile))
	}
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return fmt.Errorf("fleet: connect to %s: %w", fleetstate.RedactURL(natsURL), err)
	}
	defer nc.Close()
	var js jetstream.JetStream
	if apiPrefix != "" {
		js, err = jetstream.NewWithAPIPrefix(nc, apiPrefix)
	} else {
		js, err = jetstream.New(nc)
	}
	if err != nil {
		return err
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("fleet: stream %s at %s: %w", stream, fleetstate.RedactURL(natsURL), err)
	}
	info := s.CachedInfo()
	st := info.State
	host := hostOfStream(stream)
	rep, err := readReport(ctx, js, host, info.Config.Metadata[metaHostID])
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	word := hostWord{lastSeq: rep.LastSeq, digest: events.JournalDigestEvent{Seq: rep.DigestSeq, Digest: rep.Digest}}
	if err := checksError(stream, spanChecks(st, word)); err != nil {
		return err
	}
	// The digest covers every record, a rejected one too: it is the
	// host's word on what its journal holds.
	var chain events.Chain
	pass := func(rec journal.Record) error {
		if rec.Seq <= word.digest.Seq {
			chain.Add(rec.Seq, rec.Data)
		}
		if !strings.HasPrefix(rec.Subject, host+".") {
			if reject != nil {
				reject(Rejected{Stream: stream, Seq: rec.Seq, Subject: rec.Subject, Reason: fmt.Sprintf("not a subject of host %s", host)})
			}
			return nil
		}
		return fn(rec)
	}
	if apiPrefix == "" {
		if err := streamscan.Scan(ctx, s, streamscan.Range{}, pass); err != nil {
			return err
		}
		return checksError(stream, digestCheck(chain, word))
	}
	for seq := st.FirstSeq; seq <= st.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return fmt.Errorf("fleet: %s sequence %d: %w", stream, seq, err)
		}
		if err := pass(journal.Record{Seq: m.Sequence, Subject: m.Subject, MsgID: m.Header.Get(jetstream.MsgIDHeader), Time: m.Time, Data: m.Data}); err != nil {
			return err
		}
	}
	return checksError(stream, digestCheck(chain, word))
}
