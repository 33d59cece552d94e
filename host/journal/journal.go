// Package journal owns the embedded NATS JetStream server that stores
// nexus's event journal. It is the only package that imports nats-server;
// the rest of nexus sees Append, Read, Follow and Get over opaque bytes.
package journal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/lease"
	"github.com/nexus-sandbox/nexus/host/streamscan"
)

const (
	// StreamName is the one stream holding every lifecycle event.
	StreamName = "NEXUS"
	// Subjects is the subject space of stored events; see events.Subject.
	// Live subscribers receive each event there only once it is stored,
	// with its journal sequence in the Nats-Sequence header (RePublish).
	Subjects = "nexus.events.>"
	// appendSubjects is where nexus publishes an append. The stream
	// captures it and stores it under Subjects (SubjectTransform), so no
	// subscriber ever sees a publish the journal refused or de-duplicated.
	appendSubjects = "nexus.append.>"
	// Format is the on-disk layout version of the journal directory. A
	// directory stamped with a higher number was written by a newer nexus.
	Format = 1

	formatFile = "FORMAT"
	lockFile   = "LOCK"
	// account is the NATS account holding the stream; every user is in the
	// global account, which also names the store's directory.
	account = "$G"
)

var (
	// ErrLocked means another process owns the store; talk to it instead.
	ErrLocked = errors.New("journal is owned by another process")
	// ErrNewerFormat means the directory was written by a newer nexus.
	ErrNewerFormat = errors.New("journal written by a newer nexus")
	// ErrConflict means an expected-last-sequence append lost a race.
	ErrConflict = errors.New("journal moved on: expected last sequence does not match")
)

// Options configure Open.
type Options struct {
	// Dir is <state-root>/journal.
	Dir string
	// Listen, if set ("127.0.0.1:0" picks a free port), exposes NATS on TCP
	// for external subscribers. Empty opens no port at all.
	Listen string
	// Subscriber is the read-only identity for external clients; required
	// when Listen is set.
	Subscriber *Credentials
	// Mirror, if set, replicates the journal through a leaf-node link
	// (the fleet's mirror).
	Mirror LeafMirror
	// Space is the free-space policy of appends; nil means DefaultSpace
	// of the filesystem holding Dir.
	Space *Space
	// Logger receives the embedded server's log lines; nil discards them.
	Logger *slog.Logger
	// TLS, if set, makes the Listen port TLS-only.
	TLS *TLS
	// DedupeWindow is how long JetStream recognises a message id sent
	// again (0: DefaultDedupeWindow). Tests shorten it to reach what lies
	// beyond it without waiting.
	DedupeWindow time.Duration
}

// DefaultDedupeWindow is the journal stream's de-duplication window.
const DefaultDedupeWindow = 2 * time.Minute

// TLS is the listener's certificate and, if ClientCA is set, the CA a
// subscriber's client certificate must chain to (mutual TLS).
type TLS struct {
	CertFile, KeyFile string
	ClientCA          string
}

// Credentials name a NATS user. PasswordHash is a bcrypt hash; the server
// never holds the clear password of a subscriber.
type Credentials struct {
	User         string
	PasswordHash string
}

// Journal is an open, exclusively owned journal.
type Journal struct {
	dir    string
	dedupe time.Duration // the stream's de-duplication window
	lease  *lease.Lease
	srv    *server.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	space  Space

	smu    sync.RWMutex // guards stream, replaced when the store is reopened
	stream jetstream.Stream

	// wmu serialises appends with reopening the store. broken is why the
	// store stopped taking writes ("" while it takes them); the next append
	// reopens it. jsConfig is JetStream's configuration as the server
	// computed it at start, for reopening.
	wmu      sync.Mutex
	synced   syncState
	broken   string
	reopened int
	jsConfig server.JetStreamConfig

	read  atomic.Uint64 // records handed to readers; see RecordsRead
	check BlockCheck    // Open's block verification; see BlockCheck

	mirror LeafMirror // Options.Mirror, stopped by Close

	// log is Options.Logger (discarding if nil).
	log    *slog.Logger
	srvLog *serverLog
}

// Record is one stored event, as bytes.
type Record = streamscan.Record

// Range selects records by position (streamscan.Range).
type Range = streamscan.Range

// ErrFollowBounded refuses a follow with an upper bound
// (streamscan.ErrFollowBounded).
var ErrFollowBounded = streamscan.ErrFollowBounded

// slowHostTimeout bounds the in-process handshake (both sides) and every
// JetStream request made without a deadline of its own. The libraries'
// defaults (2 s to authenticate, 5 s per request) are for a remote server
// on a quiet network; here the server shares a host whose CPU and disk may
// be busy elsewhere, and a journal that gives up early fails the command.
// An append to a store that failed a write is not kept waiting that long
// (awaitAnswer).
const slowHostTimeout = 30 * time.Second

// Open takes the store's lock, verifies the message blocks (those an earlier
// Open verified and nothing changed since are not read again), and starts the
// embedded server. It never creates a second owner: if the lock is held it
// returns ErrLocked without touching the store.
func Open(ctx context.Context, opts Options) (*Journal, error) {
	l, err := Lock(opts.Dir)
	if err != nil {
		return nil, err
	}
	j, err := l.Open(ctx, opts)
	if err != nil {
		l.Release()
		return nil, err
	}
	return j, nil
}

// Locked is a journal directory whose lock this process holds and whose
// server it has not started: what the files hold cannot change under it.
type Locked struct {
	dir   string
	lease *lease.Lease
}

// Lock takes the journal's lock in dir (created if missing) without
// starting its server; ErrLocked if another process holds it.
func Lock(dir string) (*Locked, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := mkdirDurable(dir); err != nil {
		return nil, fmt.Errorf("journal %s: %w", dir, err)
	}
	l, err := lease.TryAcquire(filepath.Join(dir, lockFile))
	if errors.Is(err, lease.ErrHeld) {
		return nil, fmt.Errorf("%w: %v", ErrLocked, err)
	}
	if err != nil {
		return nil, fmt.Errorf("journal %s: %w", dir, err)
	}
	return &Locked{dir: dir, lease: l}, nil
}

// Dir is the journal's directory.
func (l *Locked) Dir() string { return l.dir }

// Release lets the lock go, for a journal that was not opened (or whose
// Open failed); an opened journal's Close releases it.
func (l *Locked) Release() error { return l.lease.Release() }

// Open verifies the blocks and starts the server on the locked directory
// (opts.Dir is ignored). The Journal owns the lock from then on; if Open
// fails the lock stays held, for the caller to Release.
func (l *Locked) Open(ctx context.Context, opts Options) (*Journal, error) {
	j := &Journal{dir: l.dir, lease: l.lease, log: opts.Logger, dedupe: opts.DedupeWindow}
	if j.dedupe <= 0 {
		j.dedupe = DefaultDedupeWindow
	}
	if j.log == nil {
		j.log = slog.New(slog.DiscardHandler)
	}
	if opts.Space != nil {
		j.space = *opts.Space
	} else if size, err := disk.FilesystemBytes(l.dir); err == nil {
		j.space = DefaultSpace(size)
	}
	if err := j.start(ctx, opts); err != nil {
		j.stop()
		return nil, err
	}
	return j, nil
}

func (j *Journal) start(ctx context.Context, opts Options) error {
	if err := checkFormat(j.dir); err != nil {
		return err
	}
	// The file store truncates a block it cannot parse as it loads it, so
	// damage must be caught before the server ever sees the directory;
	// blocks verified by an earlier open are not read again (verified.go).
	if err := j.verifyBlocks(); err != nil {
		return err
	}
	internalPass, err := randomSecret()
	if err != nil {
		return err
	}
	sopts, err := serverOptions(j.dir, opts, internalPass)
	if err != nil {
		return err
	}
	srv, err := server.NewServer(sopts)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.srv = srv
	logs := newServerLog(opts.Logger)
	j.srvLog = logs
	srv.SetLoggerV2(logs, false, false, false)
	srv.Start()
	if err := logs.waitReady(ctx, srv, slowHostTimeout); err != nil {
		if opts.Listen != "" {
			return fmt.Errorf("journal: --listen %s: %w", opts.Listen, err)
		}
		return fmt.Errorf("journal: %w", err)
	}
	if c := srv.JetStreamConfig(); c != nil {
		j.jsConfig = *c
		// EnableJetStream appends "jetstream" to the directory it is given.
		j.jsConfig.StoreDir = filepath.Dir(c.StoreDir)
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv), nats.UserInfo(internalUser, internalPass),
		nats.Name("nexus"), nats.MaxReconnects(-1), nats.Timeout(slowHostTimeout))
	if err != nil {
		return fmt.Errorf("journal: connect in process: %w", err)
	}
	j.nc = nc
	if j.js, err = jetstream.New(nc, jetstream.WithDefaultTimeout(slowHostTimeout)); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.stream, err = j.js.CreateOrUpdateStream(ctx, streamConfig(j.dedupe))
	if err != nil {
		return fmt.Errorf("journal: open stream %s: %w", StreamName, err)
	}
	if err := j.syncStreamFiles(); err != nil {
		return err
	}
	if err := writeFormat(j.dir); err != nil {
		return err
	}
	if opts.Listen != "" {
		if err := j.serveHistory(); err != nil {
			return err
		}
	}
	if m := opts.Mirror; m != nil {
		j.mirror = m
		return m.Start(ctx, Linked{
			Journal: j, Conn: j.nc, Log: j.log, Refused: j.srvLog.linkRefused,
			Up:    func() bool { return j.srv.NumLeafNodes() > 0 },
			Peers: func() []LeafPeer { return leafPeers(j.srv) },
		})
	}
	return nil
}

// verifyBlocks verifies what changed in the message blocks since an
// earlier Open verified them, and records the result for the next one.
func (j *Journal) verifyBlocks() error {
	prev := readMarks(j.dir)
	next, chk, err := verifyBlocksSince(j.msgsDir(), StreamName, prev, time.Now())
	j.check = chk
	if err != nil {
		return err
	}
	if !maps.Equal(prev, next) {
		// Not recording costs the next open a full verification, not
		// correctness, so it does not stop this one.
		if err := writeMarks(j.dir, next); err != nil {
			j.log.Warn("journal.verified", "error", err)
		}
	}
	return nil
}

// BlockCheck is what Open's verification of the message blocks did: how
// many it skipped as verified by an earlier open, and how many bytes it read.
func (j *Journal) BlockCheck() BlockCheck { return j.check }

// DedupeWindow is how long the journal recognises a message id appended
// again: a retry after it is stored again unless its sender checks.
func (j *Journal) DedupeWindow() time.Duration { return j.dedupe }

func streamConfig(dedupe time.Duration) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:             StreamName,
		Subjects:         []string{appendSubjects},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: appendSubjects, Destination: Subjects},
		RePublish:        &jetstream.RePublish{Source: Subjects, Destination: Subjects},
		Storage:          jetstream.FileStorage,
		Retention:        jetstream.LimitsPolicy,
		MaxMsgs:          -1,
		MaxBytes:         -1,
		Replicas:         1,
		Duplicates:       dedupe,
		// The journal is append-only: nothing, not even nexus, deletes or
		// purges history. PersistMode stays default: async persistence
		// acknowledges a publish before the message is written to its
		// block, and the journal's fsync (sync.go) covers only what the
		// server has written.
		DenyDelete:  true,
		DenyPurge:   true,
		AllowDirect: true,
		// AppendBatch: a saga step's events, or concurrent appends, stored
		// all or nothing with one fsync. Open updates an existing stream's
		// config, so journals made before batches take them too.
		AllowAtomicPublish: true,
	}
}

// formatAt names FORMAT as fsx sees it: beneath the journal's parent, so a
// link at journal/ or at FORMAT, or a FIFO planted there, is refused.
func formatAt(dir string) (root, rel string) {
	return filepath.Dir(dir), filepath.Join(filepath.Base(dir), formatFile)
}

func checkFormat(dir string) error {
	data, err := fsx.ReadFile(formatAt(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(string(data), "nexus-journal")))
	if err != nil {
		return fmt.Errorf("journal: %s is damaged: %q", filepath.Join(dir, formatFile), data)
	}
	if v > Format {
		return fmt.Errorf("%w: %s says format %d, this nexus reads up to %d", ErrNewerFormat, dir, v, Format)
	}
	return nil
}

func writeFormat(dir string) error {
	root, rel := formatAt(dir)
	if _, err := fsx.Stat(root, rel); err == nil {
		return nil
	}
	content := fmt.Sprintf("nexus-journal %d\n", Format)
	if err := fsx.WriteFile(root, rel, []byte(content), 0o600); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

// Dir is the journal directory.
func (j *Journal) Dir() string { return j.dir }

// ClientURL is the TCP address external subscribers dial, or "" if none.
func (j *Journal) ClientURL() string {
	if j.srv == nil || j.srv.Addr() == nil {
		return ""
	}
	return j.srv.ClientURL()
}

// Close stops the server and releases the lock, in that order, so no other
// process can open the store while this server still has its files open.
func (j *Journal) Close() error {
	return j.CloseThen(nil)
}

// CloseThen stops the server, runs then (if set) while the lock is still
// held and the files are as the server left them, and releases the lock.
func (j *Journal) CloseThen(then func() error) error {
	j.stop()
	var err error
	if then != nil {
		err = then()
	}
	return errors.Join(err, j.lease.Release())
}

// stop stops the server and waits until it has written its files.
func (j *Journal) stop() {
	if j.mirror != nil {
		j.mirror.Stop()
	}
	if j.nc != nil {
		j.nc.Drain()
		j.nc.Close()
	}
	if j.srv != nil {
		j.srv.Shutdown()
		j.srv.WaitForShutdown()
	}
}

// Message is one append.
type Message struct {
	Subject string
	// ID de-duplicates: a retried append with the same ID is stored once.
	ID   string
	Data []byte
	// ExpectLastSeq, if set, makes the append fail with ErrConflict unless
	// the stream's last sequence is exactly *ExpectLastSeq.
	ExpectLastSeq *uint64
	// Reserve admits the append into the space reserve (down to
	// Space.Floor): it records an operation that frees space.
	Reserve bool
	// ExpectSubjects, with ExpectSubjectSeq, makes the journal itself
	// refuse the append (ErrStaleSubject) unless the last record on any
	// subject matching this filter is at ExpectSubjectSeq (0: none yet).
	// nexus uses it for an entity's subjects, nexus.events.*.*.<sandbox>.
	ExpectSubjects   string
	ExpectSubjectSeq uint64
}

// ErrStaleSubject means an ExpectSubjects append found a newer record on
// those subjects than the writer expected.
var ErrStaleSubject = errors.New("journal moved on: a newer record on the expected subjects")

// Ack is the journal's acknowledgement of an append, given only after the
// message is on disk (the journal fsyncs the store before it returns one;
// see sync.go).
type Ack struct {
	Seq       uint64
	Duplicate bool
}

// Append stores m durably. A retry after a crash with the same ID returns the
// original sequence with Duplicate set, also when ExpectLastSeq no longer
// holds, because the server checks the expected sequence before the id.
func (j *Journal) Append(ctx context.Context, m Message) (Ack, error) {
	if m.ID == "" {
		return Ack{}, errors.New("journal append: message id is required")
	}
	j.wmu.Lock()
	defer j.wmu.Unlock()
	if err := j.checkSpace(m.Reserve); err != nil {
		return Ack{}, fmt.Errorf("journal append %s: %w", m.ID, err)
	}
	if j.broken != "" {
		if err := j.reopenStore(ctx); err != nil {
			return Ack{}, fmt.Errorf("journal append %s: %w", m.ID, err)
		}
	}
	msg, popts := publishArgs(m)
	if m.ExpectLastSeq != nil {
		popts = append(popts, jetstream.WithExpectLastSequence(*m.ExpectLastSeq))
	}
	var ack *jetstream.PubAck
	err := j.awaitAnswer(ctx, func(ctx context.Context) (err error) {
		ack, err = j.js.PublishMsg(ctx, msg, popts...)
		return err
	})
	if err == nil {
		// The server wrote it; the ack waits for the fsync (sync.go).
		if err := j.syncStore(); err != nil {
			return Ack{}, j.failedAppend(m.ID, err)
		}
		return Ack{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
	}
	var apiErr *jetstream.APIError
	stale := fmt.Errorf("journal append %s: %w (expected %d on %s)", m.ID, ErrStaleSubject, m.ExpectSubjectSeq, m.ExpectSubjects)
	if m.ExpectSubjects != "" && m.ExpectLastSeq == nil && errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return Ack{}, stale
	}
	if m.ExpectLastSeq != nil && errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		seq, found, ferr := j.findMsgID(ctx, *m.ExpectLastSeq+1, m.ID)
		if ferr != nil {
			return Ack{}, fmt.Errorf("journal append %s: %w (and looking it up: %v)", m.ID, ErrConflict, ferr)
		}
		if found {
			// Stored by an append that may have died before its fsync.
			if err := j.syncStore(); err != nil {
				return Ack{}, j.failedAppend(m.ID, err)
			}
			return Ack{Seq: seq, Duplicate: true}, nil
		}
		// Both checks report the same error code: the stream not having
		// moved means it was the subject check that refused.
		if last, lerr := j.LastSeq(ctx); m.ExpectSubjects != "" && lerr == nil && last == *m.ExpectLastSeq {
			return Ack{}, stale
		}
		return Ack{}, fmt.Errorf("journal append %s: %w", m.ID, ErrConflict)
	}
	return Ack{}, j.failedAppend(m.ID, err)
}

// AppendSubject is the subject an append of an event stored on subject is
// published to (see appendSubjects).
func AppendSubject(subject string) string {
	if rest, ok := strings.CutPrefix(subject, strings.TrimSuffix(Subjects, ">")); ok {
		return strings.TrimSuffix(appendSubjects, ">") + rest
	}
	return subject
}

// findMsgID looks for id among records from seq on: the tail written since
// the writer last looked.
func (j *Journal) findMsgID(ctx context.Context, from uint64, id string) (uint64, bool, error) {
	var seq uint64
	err := j.Read(ctx, from, Subjects, func(r Record) error {
		if r.MsgID == id {
			seq = r.Seq
			return errStop
		}
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	return seq, seq != 0, nil
}

var errStop = streamscan.ErrStop

// expectedLastSubjSeqSubjHeader names the subject filter the server checks
// Nats-Expected-Last-Subject-Sequence against (nats-server 2.11+; the
// client library has no constant for it).
const expectedLastSubjSeqSubjHeader = "Nats-Expected-Last-Subject-Sequence-Subject"

// LastSeq is the sequence of the newest record (0 for an empty journal).
func (j *Journal) LastSeq(ctx context.Context) (uint64, error) {
	info, err := j.currentStream().Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("journal: %w", err)
	}
	return info.State.LastSeq, nil
}

// LastOnSubject is the sequence of the newest record on subject (an exact
// subject, no wildcard), 0 if there is none: what an append expecting
// that subject's last sequence must name.
func (j *Journal) LastOnSubject(ctx context.Context, subject string) (uint64, error) {
	m, err := j.currentStream().GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("journal: last record on %s: %w", subject, err)
	}
	return m.Sequence, nil
}

// Get returns the record at seq.
func (j *Journal) Get(ctx context.Context, seq uint64) (Record, error) {
	m, err := j.currentStream().GetMsg(ctx, seq)
	if err != nil {
		return Record{}, fmt.Errorf("journal: get %d: %w", seq, err)
	}
	return Record{Seq: m.Sequence, Subject: m.Subject, MsgID: m.Header.Get(jetstream.MsgIDHeader), Time: m.Time, Data: m.Data}, nil
}

// Read calls fn for every record at or after from that matches filter, up
// to the newest record that existed when Read began, then returns. If fn
// returns an error, Read stops and returns it.
func (j *Journal) Read(ctx context.Context, from uint64, filter string, fn func(Record) error) error {
	return j.Scan(ctx, Range{From: from, Filters: []string{filter}}, fn)
}

// Follow is Read that does not stop at the end: it waits for new records
// until ctx is done, then returns ctx.Err().
func (j *Journal) Follow(ctx context.Context, from uint64, filter string, fn func(Record) error) error {
	return j.Scan(ctx, Range{From: from, Filters: []string{filter}, Follow: true}, fn)
}

// Scan calls fn for the records r selects, in journal order. Filters
// naming every subject (Subjects) read the whole stream.
func (j *Journal) Scan(ctx context.Context, r Range, fn func(Record) error) error {
	if slices.Contains(r.Filters, Subjects) {
		r.Filters = nil
	}
	return streamscan.ScanCounting(ctx, j.currentStream(), r, &j.read, fn)
}

// RecordsRead counts the records this journal has handed to readers since
// it opened: what a read cost, for tests that prove reads are positional.
func (j *Journal) RecordsRead() uint64 { return j.read.Load() }

func (j *Journal) currentStream() jetstream.Stream {
	j.smu.RLock()
	defer j.smu.RUnlock()
	return j.stream
}
