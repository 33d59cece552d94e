package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
)

// groupCommit coalesces concurrent appends. A caller queues its request,
// then either sees it done or takes the committer token; the holder commits
// everything queued so far as one journal batch (one fsync) while the next
// requests queue up behind it. There is no timer: a lone append is
// committed at once, and a group forms only while a commit is under way.
//
// The token covers publishing a group, not its fsync: once the journal has
// stored and the views have folded a group, the holder waits for its turn
// to sync (the fsync under way, if any, ends), hands the token on, and
// only then fsyncs, so the next group is published while this one syncs
// (a database's pipelined group commit). Its writers are answered only
// after that fsync. Handing the token on only at the turn keeps one group
// waiting at most: writers arriving meanwhile form the next group, not
// many small ones that each pay a publish round trip.
type groupCommit struct {
	mu    sync.Mutex
	queue []*appendReq
	token chan struct{}
}

func newGroupCommit() groupCommit { return groupCommit{token: make(chan struct{}, 1)} }

// appendReq is one AppendExpect call.
type appendReq struct {
	expect []core.Expect
	evs    []events.Event
	data   [][]byte // evs encoded, or nil
	seqs   []uint64
	err    error
	done   chan struct{}
	// taken: a committer has this request in its group; its writer only
	// waits for the answer, without competing for the token again (it
	// would spin while its group syncs with the token free).
	taken atomic.Bool
}

func (r *appendReq) finish(seqs []uint64, err error) {
	r.seqs, r.err = seqs, err
	close(r.done)
}

func (n *Store) groupAppend(ctx context.Context, expect []core.Expect, evs []events.Event, data [][]byte) ([]uint64, error) {
	r := &appendReq{expect: expect, evs: evs, data: data, done: make(chan struct{})}
	if n.obs != nil {
		start := time.Now()
		defer func() { n.obs.Appended(time.Since(start), r.err) }()
	}
	n.gc.mu.Lock()
	n.gc.queue = append(n.gc.queue, r)
	n.gc.mu.Unlock()
	for {
		select {
		case <-r.done:
			return r.seqs, r.err
		case n.gc.token <- struct{}{}:
			if r.taken.Load() {
				<-n.gc.token
				<-r.done
				return r.seqs, r.err
			}
			answer := n.commitQueued(ctx)()
			<-n.gc.token
			answer()
		}
	}
}

// commitQueued commits what is queued: requests that touch no entity or
// saga an earlier request of this group touches go into one batch; the
// others wait for the next group, so every check below sees the journal
// exactly as the batch will find it. It returns what is left to do: take
// the group's turn to sync (still holding the token), then, with the token
// passed on, sync the group and answer its writers.
func (n *Store) commitQueued(ctx context.Context) (turn func() (answer func())) {
	n.mu.Lock()
	defer n.mu.Unlock()
	// Once published, a record is stored whether or not its caller is still
	// there, and the committer commits other callers' requests too: no
	// caller's cancellation may stop it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTimeout)
	defer cancel()

	n.gc.mu.Lock()
	queued := n.gc.queue
	n.gc.queue = nil
	n.gc.mu.Unlock()

	// The views are dropped if a fold failed (foldLocked): nothing is
	// decided against views that do not hold the journal.
	if err := n.loadLocked(ctx); err != nil {
		for _, r := range queued {
			r.taken.Store(true)
			r.finish(nil, err)
		}
		return func() func() { return func() {} }
	}

	var group []*appendReq
	var later []*appendReq
	touched := map[string]bool{}
	size := 0
	for _, r := range queued {
		keys := requestKeys(r)
		clash := size+len(r.evs) > journal.MaxBatch && size > 0
		for _, k := range keys {
			clash = clash || touched[k]
		}
		// A deferred request's keys stay touched, so no later request about
		// the same entity overtakes it.
		for _, k := range keys {
			touched[k] = true
		}
		if clash {
			later = append(later, r)
			continue
		}
		group = append(group, r)
		r.taken.Store(true)
		size += len(r.evs)
	}
	if n.obs != nil && len(group) > 0 {
		n.obs.Grouped(len(group), size)
	}
	if len(later) > 0 {
		n.gc.mu.Lock()
		n.gc.queue = append(later, n.gc.queue...)
		n.gc.mu.Unlock()
	}
	return n.commitGroupLocked(ctx, group)
}

// requestKeys names what a request's checks read and its events change:
// the entities it expects or its events concern (core.EntitiesOf), and
// the sagas it writes.
func requestKeys(r *appendReq) []string {
	var keys []string
	for _, x := range r.expect {
		keys = append(keys, string(x.Entity))
	}
	for _, e := range r.evs {
		for _, ent := range core.EntitiesOf(e) {
			keys = append(keys, string(ent))
		}
		if e.Saga != "" {
			keys = append(keys, "saga/"+e.Saga)
		}
	}
	return keys
}

// planned is one request's part of a batch: its events up to the first one
// refused, and the refusal.
type planned struct {
	r       *appendReq
	n       int   // events of r in the batch
	refusal error // after those events
	// stored: r's events are in the journal already (a retry of an append
	// that got no answer), at these sequences; nothing is appended.
	stored []uint64
}

// commitGroupLocked commits group, whose requests touch disjoint entities:
// the single-event requests as one pipelined group with one fsync, each
// multi-event request (a saga step's events) as one atomic batch. The
// single-event requests stored are answered, after their fsync, by the
// functions it returns (see commitQueued); every other request is answered
// before it returns.
func (n *Store) commitGroupLocked(ctx context.Context, group []*appendReq) (turn func() (answer func())) {
	var singles, multis []planned
	var msgs []journal.Message
	var multiMsgs [][]journal.Message
	for _, r := range group {
		p, rmsgs, err := n.planLocked(ctx, r)
		switch {
		case err != nil:
			r.finish(nil, err)
		case p.stored != nil:
			r.finish(p.stored, nil)
		case p.n == 0:
			r.finish(nil, p.refusal)
		case p.n == 1:
			singles = append(singles, p)
			msgs = append(msgs, rmsgs...)
		default:
			multis = append(multis, p)
			multiMsgs = append(multiMsgs, rmsgs)
		}
	}
	turn = func() func() { return func() {} }
	if len(singles) > 0 {
		acks, _ := n.j.PublishGroup(ctx, n.sandboxes.Seq(), msgs)
		// The stored prefix is in the journal, durable or not yet: the
		// views fold it now, so the next group is checked against it.
		for i, a := range acks {
			if !a.Duplicate { // a duplicate was folded when first stored
				n.foldLocked(a.Seq, singles[i].r.evs[0])
			}
		}
		for _, p := range singles[len(acks):] {
			// Not stored: refused, or behind the one refused. One by one,
			// each learns its own fate (and a retried id is found).
			p.r.finish(n.appendOneByOneLocked(ctx, p.r.expect, p.r.evs))
		}
		if stored := singles[:len(acks)]; len(stored) > 0 {
			turn = func() func() {
				sync := n.j.SyncTurn()
				return func() {
					// Acknowledged only once on disk: every ack after its fsync.
					err := sync(acks[len(acks)-1].Seq)
					for i, p := range stored {
						if err != nil {
							p.r.finish(nil, err)
							continue
						}
						p.r.finish([]uint64{acks[i].Seq}, p.refusal)
					}
				}
			}
		}
	}
	for i, p := range multis {
		n.commitAtomicLocked(ctx, p, multiMsgs[i])
	}
	return turn
}

// commitAtomicLocked appends one request's events as one atomic batch. If
// the journal refuses the batch as a whole, the events are appended one by
// one, which finds a retry's stored ids and names the refused event.
func (n *Store) commitAtomicLocked(ctx context.Context, p planned, msgs []journal.Message) {
	if len(msgs) > journal.MaxBatch {
		// More than the server takes in one batch: one by one, as before
		// batches existed.
		p.r.finish(n.appendOneByOneLocked(ctx, p.r.expect, p.r.evs))
		return
	}
	last := n.sandboxes.Seq()
	msgs[0].ExpectLastSeq = &last
	acks, err := n.j.AppendBatch(ctx, msgs)
	if errors.Is(err, journal.ErrBatchRefused) {
		p.r.finish(n.appendOneByOneLocked(ctx, p.r.expect, p.r.evs))
		return
	}
	if err != nil {
		p.r.finish(nil, err)
		return
	}
	seqs := make([]uint64, len(acks))
	for i, a := range acks {
		n.foldLocked(a.Seq, p.r.evs[i])
		seqs[i] = a.Seq
	}
	p.r.finish(seqs, p.refusal)
}

// planLocked checks r against the views as they are before the batch
// (admitLocked): a stale expectation refuses the whole request, and an
// event refused ends it there, the events before it still appended. It
// returns r's messages.
func (n *Store) planLocked(ctx context.Context, r *appendReq) (planned, []journal.Message, error) {
	p := planned{r: r}
	k, err := n.admitLocked(ctx, r.expect, r.evs)
	if seqs, ok := errStored(err); ok {
		p.stored = seqs
		return p, nil, nil
	}
	if k == 0 && err != nil {
		return p, nil, err
	}
	p.refusal = err
	msgs, err := n.messagesLocked(ctx, r.expect, r.evs[:k], r.data)
	if err != nil {
		return p, nil, err
	}
	p.n = k
	return p, msgs, nil
}

// messagesLocked turns admitted events into journal messages, with the
// expectations the journal checks again itself: the first event's on its
// sandbox's subjects, each handle.claimed's on its handle's subject, at
// the sequence the decision saw (the handle's current one if the
// decision named none), and the first volume.created or .removed of a
// volume on the volume's subject (volumeJournalSeqLocked). data, if set,
// is evs encoded.
func (n *Store) messagesLocked(ctx context.Context, expect []core.Expect, evs []events.Event, data [][]byte) ([]journal.Message, error) {
	kinds := map[string]events.SagaKind{} // of the sagas evs start
	volumes := map[string]bool{}          // whose own subject an earlier message writes
	msgs := make([]journal.Message, 0, len(evs))
	for i, e := range evs {
		kind := n.sagaKind(e)
		if _, ok := e.Payload.(events.SagaStartedEvent); ok {
			kinds[e.Saga] = kind
		} else if k, ok := kinds[e.Saga]; ok {
			kind = k
		}
		subject, err := e.Subject()
		if err != nil {
			return nil, err
		}
		var b []byte
		if data != nil {
			b = data[i]
		} else if b, err = events.Encode(e); err != nil {
			return nil, err
		}
		m := journal.Message{Subject: subject, ID: e.DedupID(), Data: b, Reserve: freesSpace(e, kind)}
		if name, own := events.VolumeOf(e); own {
			if !volumes[name] {
				volumes[name] = true
				m.ExpectSubjects = events.VolumeSubjects(name)
				if m.ExpectSubjectSeq, err = n.volumeJournalSeqLocked(ctx, expect, name); err != nil {
					return nil, err
				}
			}
		} else if i == 0 {
			if x := journalExpectation(expect, e); x != nil {
				m.ExpectSubjects, m.ExpectSubjectSeq = events.SandboxSubjects(e.Sandbox), x.Seq
			}
		}
		if c, ok := e.Payload.(events.HandleClaimedEvent); ok {
			m.ExpectSubjects = subject
			if x := expectationOf(expect, core.Handle(c.Handle)); x != nil {
				m.ExpectSubjectSeq = x.Seq
			} else if m.ExpectSubjectSeq, err = n.handleRevLocked(ctx, c.Handle); err != nil {
				return nil, err
			}
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// admitLocked applies core.Admit to a call against the views (see
// ledger). A stale expectation may be the call's own earlier attempt: a
// writer whose append got no answer (its daemon was killed between the
// journal's ack and the reply) sends the same events again through the
// next daemon, and the journal's message-id de-duplication never sees
// them, because the expectation refuses first. If every event of the call
// is stored after the expected sequence, the answer is storedError with
// their sequences. Otherwise it is how many events are admitted and why
// the next one is not.
func (n *Store) admitLocked(ctx context.Context, expect []core.Expect, evs []events.Event) (int, error) {
	k, err := admit(ledger{n: n, ctx: ctx}, expect, evs)
	var stale *core.StaleError
	if errors.As(err, &stale) {
		if seqs := n.findStoredLocked(ctx, journal.Range{From: stale.Expected + 1}, evs); seqs != nil {
			return 0, storedError(seqs)
		}
		stale.Latest = n.typeAt(ctx, stale.Actual)
		return 0, stale
	}
	if seqs := n.findAgedLocked(ctx, evs); seqs != nil {
		return 0, storedError(seqs)
	}
	return k, err
}

// admit is core.Admit; the tests that prove the journal's own checks
// replace it with one that admits everything.
var admit = core.Admit

// ledger is the views as core.Admit reads them. Call with n.mu held.
type ledger struct {
	n   *Store
	ctx context.Context
}

func (l ledger) Rev(entity core.Entity) (uint64, error) { return l.n.revLocked(l.ctx, entity) }

func (l ledger) SagaOpen(id string) bool { return l.n.sagas.Get(id) != nil }

func (l ledger) Holder(handle string) (string, error) {
	sb, err := l.n.sandboxes.byHandle(handle)
	if err != nil || sb == nil {
		return "", err
	}
	return sb.ID, nil
}

// findAgedLocked finds evs already stored when they are old enough that
// the journal might no longer recognise them: JetStream drops a message id
// sent again only within its de-duplication window, so an append retried
// after it (a client stopped mid-append, a daemon that took minutes to
// come back) would be stored twice. A retry sends the very events it sent
// before, and their ids date them: once the oldest is half a window old,
// the records on their subjects since just before it are searched. A
// fresh append searches nothing.
func (n *Store) findAgedLocked(ctx context.Context, evs []events.Event) []uint64 {
	if len(evs) == 0 {
		return nil
	}
	oldest := evs[0].ID.Time()
	for _, e := range evs[1:] {
		oldest = min(oldest, e.ID.Time())
	}
	since := ulid.Time(oldest)
	if time.Since(since) < n.j.DedupeWindow()/2 {
		return nil
	}
	return n.findStoredLocked(ctx, journal.Range{FromTime: since.Add(-time.Second)}, evs)
}

// storedError is a call whose events are all in the journal already.
type storedError []uint64

func (storedError) Error() string { return "already stored" }

func errStored(err error) ([]uint64, bool) {
	var s storedError
	if errors.As(err, &s) {
		return s, true
	}
	return nil, false
}

// findStoredLocked returns the sequences of evs (the same events: id and
// message id), in order, among the records of from (its start: after the
// expectation the writer decided on, or since the events were made) on
// their own subjects, or nil unless all are there.
func (n *Store) findStoredLocked(ctx context.Context, from journal.Range, evs []events.Event) []uint64 {
	var filters []string
	seen := map[string]bool{}
	for _, e := range evs {
		subject, err := e.Subject()
		if err != nil {
			return nil
		}
		if !seen[subject] {
			seen[subject] = true
			filters = append(filters, subject)
		}
	}
	seqs := make([]uint64, 0, len(evs))
	found := errors.New("found")
	from.Filters = filters
	err := n.j.Scan(ctx, from, func(rec journal.Record) error {
		want := evs[len(seqs)]
		if rec.MsgID != want.DedupID() {
			return nil
		}
		// The same event, not another with the same id (a saga step
		// decided twice): the retry sends the very event it sent before.
		if e, err := events.Decode(rec.Data); err == nil && e.ID == want.ID {
			seqs = append(seqs, rec.Seq)
			if len(seqs) == len(evs) {
				return found
			}
		}
		return nil
	})
	if err != found {
		return nil
	}
	return seqs
}
