// Package streamscan reads a range of a JetStream stream of nexus records
// (a journal, a host's mirror, the fleet's aggregate) through one ordered
// consumer, over the NATS client alone: a reader of the fleet links it
// without the embedded server.
package streamscan

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Range selects records by position, so a reader fetches only what it asked
// for: JetStream finds the start (by sequence or by stored time) and filters
// by subject on the server, and a tail is located by counting, not reading.
type Range struct {
	From     uint64    // first sequence (0: the start)
	FromTime time.Time // if set, also no record stored before it
	To       uint64    // last sequence (0: no bound)
	ToTime   time.Time // if set, also no record stored after it
	// Filters are subject filters that must not overlap (none: every subject).
	Filters []string
	// Tail, if positive, keeps only the last Tail records of the range.
	Tail int
	// Limit, if positive, delivers at most the first Limit records.
	Limit int
	// Follow waits for new records after the range's end until ctx is done.
	Follow bool
}

// ErrFollowBounded refuses a follow with an upper bound: it would wait for
// a record past the bound that may never match.
var ErrFollowBounded = errors.New("journal: a follow has no upper bound")

// Record is one stored record.
type Record struct {
	Seq     uint64
	Subject string
	MsgID   string
	Time    time.Time
	Data    []byte
	// Source is a sourced record's Nats-Stream-Source header (the fleet's
	// aggregate), else "".
	Source string
}

// ErrStop, returned by a read's fn, ends the read without an error.
var ErrStop = errors.New("stop")

// Scan calls fn for the records r selects from stream, in stream order,
// one at a time, most often on the NATS client's goroutine (not the
// caller's). A
// read that cannot reach its range's end (the connection closed, its
// consumer not made again) returns an error, never a short read.
func Scan(ctx context.Context, stream jetstream.Stream, r Range, fn func(Record) error) error {
	return ScanCounting(ctx, stream, r, nil, fn)
}

// ScanLooked is Scan of a stream just looked up (jetstream's Stream):
// its cached state is where the read ends, one request fewer before the
// first record.
func ScanLooked(ctx context.Context, stream jetstream.Stream, r Range, fn func(Record) error) error {
	return scan(ctx, stream, stream.CachedInfo(), r, nil, fn)
}

// ScanCounting is Scan that, if read is not nil, counts every record
// received into it.
func ScanCounting(ctx context.Context, stream jetstream.Stream, r Range, read *atomic.Uint64, fn func(Record) error) error {
	return scan(ctx, stream, nil, r, read, fn)
}

// scan is ScanCounting from the stream's state in info, or its state
// now when info is nil.
func scan(ctx context.Context, stream jetstream.Stream, info *jetstream.StreamInfo, r Range, read *atomic.Uint64, fn func(Record) error) error {
	if r.Follow && (r.To != 0 || !r.ToTime.IsZero()) {
		return ErrFollowBounded
	}
	filters := r.Filters
	all := len(filters) == 0
	for _, f := range filters {
		if f == "" {
			all = true
		}
	}
	if all {
		filters = nil // also a mirror's stream, whose subjects carry a host prefix
	}
	var err error
	if info == nil {
		if info, err = stream.Info(ctx); err != nil {
			return fmt.Errorf("journal: %w", err)
		}
	}
	last := info.State.LastSeq
	from := max(r.From, 1)
	if !r.FromTime.IsZero() {
		s, err := SeqAt(ctx, stream, r.FromTime)
		if err != nil {
			return err
		}
		from = max(from, s)
	}
	// end is the last sequence a bounded read may deliver.
	end := last
	if r.To != 0 {
		end = min(end, r.To)
	}
	if !r.ToTime.IsZero() {
		s, err := SeqAt(ctx, stream, r.ToTime.Add(time.Nanosecond))
		if err != nil {
			return err
		}
		end = min(end, s-1)
	}
	if !r.Follow && from > end {
		return nil
	}
	if r.Tail > 0 && !all && !r.Follow {
		if done, err := tailNearEnd(ctx, stream, info, r, from, end, read, fn); done || err != nil {
			return err
		}
	}
	// want is how many records a bounded read delivers, when known
	// without reading; it also caps each pull, so the server sends no more.
	var want uint64
	known := false
	if all {
		if from <= end {
			want, known = end-from+1, true
		}
		if r.Tail > 0 && want > uint64(r.Tail) {
			from, want = end-uint64(r.Tail)+1, uint64(r.Tail)
		}
	} else if r.Tail > 0 || !r.Follow {
		var after uint64 // matches past end: not part of the range
		if end < last {
			if after, err = pending(ctx, stream, end+1, filters); err != nil {
				return err
			}
		}
		count := func(s uint64) (uint64, error) {
			if CountedFrom != nil {
				CountedFrom(s)
			}
			p, err := pending(ctx, stream, s, filters)
			return p - min(p, after), err
		}
		total, err := count(from)
		if err != nil {
			return err
		}
		want, known = total, true
		if r.Tail > 0 && total > uint64(r.Tail) {
			// count is non-increasing in the start: find the last start
			// that still leaves Tail records. A count from s makes the
			// server load (and index by subject) every block from s on,
			// so the search gallops back from the end, then bisects
			// between the last two starts: it loads the tail's blocks,
			// not half the journal's.
			lo, hi := from, end
			for step := uint64(r.Tail); step <= end-from; step *= 4 {
				if step > (end-from)/4 {
					step = end - from // the last gallop: no overflow
				}
				s := end - step + 1
				c, err := count(s)
				if err != nil {
					return err
				}
				if c >= uint64(r.Tail) {
					lo = s
					break
				}
				hi = s - 1
			}
			for lo < hi {
				mid := lo + (hi-lo+1)/2
				c, err := count(mid)
				if err != nil {
					return err
				}
				if c >= uint64(r.Tail) {
					lo = mid
				} else {
					hi = mid - 1
				}
			}
			from, want = lo, uint64(r.Tail)
		}
	}
	if r.Limit > 0 && (!known || want > uint64(r.Limit)) {
		want, known = uint64(r.Limit), true
	}
	if !r.Follow && known && want == 0 {
		return nil
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:   filters,
		MaxResetAttempts: resetAttempts,
		DeliverPolicy:    jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:      from,
	}
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("journal: read from %d: %w", from, err)
	}
	// An ordered consumer outlives its Stop by minutes (its inactive
	// threshold); a read deletes its own so it leaves nothing behind.
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if info := cons.CachedInfo(); info != nil {
			_ = stream.DeleteConsumer(dctx, info.Name)
		}
	}()
	if !r.Follow && cons.CachedInfo().NumPending == 0 {
		return nil
	}
	batch := 1024
	if !r.Follow && known {
		batch = int(min(want, uint64(batch)))
	}
	var delivered uint64
	return consume(ctx, cons, batch, func(msg jetstream.Msg, meta ackMeta) (bool, error) {
		if read != nil {
			read.Add(1)
		}
		seq := meta.seq
		if !r.Follow && seq > end {
			return true, nil // appended after the read began
		}
		h := msg.Headers()
		rec := Record{
			Seq: seq, Subject: msg.Subject(), MsgID: h.Get(jetstream.MsgIDHeader),
			Time: meta.time(), Data: msg.Data(), Source: h.Get("Nats-Stream-Source"),
		}
		if err := fn(rec); err != nil {
			if errors.Is(err, ErrStop) {
				return true, nil
			}
			return true, err
		}
		delivered++
		if r.Limit > 0 && delivered >= uint64(r.Limit) {
			return true, nil
		}
		return !r.Follow && (meta.pending == 0 || seq == end || known && delivered >= want), nil
	})
}

// resetAttempts bounds how often an ordered consumer tries to make its
// consumer again after losing it (a lost connection, a node down): its
// last failure then ends the read, which would otherwise wait forever,
// also on a connection closed for good.
const resetAttempts = 5

// consume delivers cons's messages to each, one at a time and in stream
// order, until each says the read is done (or fails), ctx is done, or the
// consumer cannot go on. Messages come through the consumer's callback,
// on the client's goroutine: no per-message hand-off to the caller's, nor
// a heartbeat timer armed per message by an iterator. The consumer resets
// itself (a new consumer from its position) where it can; every way it
// stops short of the read's end is the read's error, never its end.
func consume(ctx context.Context, cons jetstream.Consumer, batch int, each func(jetstream.Msg, ackMeta) (done bool, err error)) error {
	var (
		mu    sync.Mutex
		ended bool
		err   error
		last  uint64 // the stream sequence last delivered
		done  = make(chan struct{})
	)
	end := func(e error) { // mu held
		if !ended {
			ended, err = true, e
			close(done)
		}
	}
	handler := func(msg jetstream.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			return
		}
		// A reset starts a new subscription while the old one's
		// callback may still be running: one at a time (mu), and
		// never a record twice or out of order.
		meta, ok := parseAck(msg.Reply())
		if !ok {
			end(fmt.Errorf("journal: read: %q is not a JetStream delivery", msg.Reply()))
			return
		}
		if meta.seq <= last {
			end(fmt.Errorf("journal: read: record %d delivered after %d", meta.seq, last))
			return
		}
		last = meta.seq
		if stop, e := each(msg, meta); stop || e != nil {
			end(e)
		}
	}
	errHandler := func(_ jetstream.ConsumeContext, e error) {
		if recovers(e) {
			return
		}
		mu.Lock()
		end(fmt.Errorf("journal: read: %w", e))
		mu.Unlock()
	}
	cc, cerr := cons.Consume(handler, jetstream.PullMaxMessages(batch), jetstream.ConsumeErrHandler(errHandler))
	if cerr != nil {
		return fmt.Errorf("journal: read: %w", cerr)
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	case <-cc.Closed():
	}
	mu.Lock()
	defer mu.Unlock()
	if ctx.Err() != nil {
		end(ctx.Err())
	}
	end(errors.New("journal: read: the consumer stopped before the read's end"))
	return err
}

// TailWindow is how many of a range's last records a filtered tail of
// tail records reads and matches before it is located by counting.
func TailWindow(tail int) uint64 { return tailWindow(tail) }

var tailWindow = func(tail int) uint64 { return 256 + 32*uint64(tail) }

// tailNearEnd looks for a filtered tail among the range's last records,
// read unfiltered and matched here, and delivers it when they hold it
// (or are the whole range). A filtered count makes the server match its
// filters against every subject of the stream (every sandbox's, for an
// event type), which at a large journal costs far more than reading a
// few hundred records; a tail further back is left to the counts.
func tailNearEnd(ctx context.Context, stream jetstream.Stream, info *jetstream.StreamInfo, r Range, from, end uint64, read *atomic.Uint64, fn func(Record) error) (bool, error) {
	start := from
	if w := tailWindow(r.Tail); end-from >= w {
		start = end - w + 1
	}
	var got []Record
	err := scan(ctx, stream, info, Range{From: start, To: end}, read, func(rec Record) error {
		for _, f := range r.Filters {
			if matchSubject(f, rec.Subject) {
				rec.Data = bytes.Clone(rec.Data)
				if got = append(got, rec); len(got) > r.Tail {
					got = got[1:]
				}
				break
			}
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if len(got) < r.Tail && start > from {
		return false, nil
	}
	if r.Limit > 0 && len(got) > r.Limit {
		got = got[:r.Limit]
	}
	for _, rec := range got {
		if err := fn(rec); err != nil {
			if errors.Is(err, ErrStop) {
				return true, nil
			}
			return true, err
		}
	}
	return true, nil
}

// matchSubject is whether subject matches the subject filter f: "*"
// stands for one token, a last ">" for one or more.
func matchSubject(f, subject string) bool {
	for {
		ft, frest, fmore := strings.Cut(f, ".")
		if ft == ">" && !fmore {
			return subject != ""
		}
		st, srest, smore := strings.Cut(subject, ".")
		if ft != "*" && ft != st {
			return false
		}
		if !fmore || !smore {
			return fmore == smore
		}
		f, subject = frest, srest
	}
}

// recovers says whether the ordered consumer goes on by itself after an
// error its callback reports: it makes a new consumer from its position
// when the heartbeats stop, when its consumer is gone and when JetStream
// does not answer; a leader change or a server shutting down is followed
// by one of those, or by a reconnection, which resets it too.
func recovers(err error) bool {
	return errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrConsumerLeadershipChanged) ||
		errors.Is(err, jetstream.ErrServerShutdown)
}

// ackMeta is what a delivered message's reply subject says of it.
type ackMeta struct {
	seq     uint64 // its stream sequence
	pending uint64 // how many of the consumer's messages follow it
	nanos   uint64 // when it was stored, in ns since the epoch
}

func (m ackMeta) time() time.Time { return time.Unix(0, int64(m.nanos)) }

// parseAck reads a delivery's reply subject, without allocating:
// "$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer
// seq>.<time>.<pending>", or with "<domain>.<account hash>." before the
// stream and more tokens after pending. False when it is neither.
func parseAck(reply string) (ackMeta, bool) {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return ackMeta{}, false
	}
	var tok [9]string
	n, more := 0, true
	for n < len(tok) && more {
		tok[n], rest, more = strings.Cut(rest, ".")
		n++
	}
	var f []string // stream, consumer, delivered, stream seq, consumer seq, time, pending
	switch {
	case n == 7 && !more:
		f = tok[:7]
	case n == 9:
		f = tok[2:]
	default:
		return ackMeta{}, false
	}
	var m ackMeta
	var err [3]error
	m.seq, err[0] = strconv.ParseUint(f[3], 10, 64)
	m.nanos, err[1] = strconv.ParseUint(f[5], 10, 64)
	m.pending, err[2] = strconv.ParseUint(f[6], 10, 64)
	if err != [3]error{} || m.seq == 0 {
		return ackMeta{}, false
	}
	return m, true
}

// CountedFrom, if set (by tests, this package's or a caller's), hears the
// start of every count a bounded read makes to locate its range.
var CountedFrom func(seq uint64)

// SeqAt is the first sequence stored at or after t (past the last one if
// none): the server finds it from its blocks' time ranges, reading nothing.
func SeqAt(ctx context.Context, stream jetstream.Stream, t time.Time) (uint64, error) {
	info, err := probe(ctx, stream, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t,
	})
	if err != nil {
		return 0, fmt.Errorf("journal: find %s: %w", t.Format(time.RFC3339Nano), err)
	}
	return info.Delivered.Stream + 1, nil
}

// pending counts records matching filters from seq on, from the server's
// per-subject index, reading none of them.
func pending(ctx context.Context, stream jetstream.Stream, seq uint64, filters []string) (uint64, error) {
	info, err := probe(ctx, stream, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq, FilterSubjects: filters,
	})
	if err != nil {
		return 0, fmt.Errorf("journal: count from %d: %w", seq, err)
	}
	return info.NumPending, nil
}

// probe creates a consumer only to read its starting state, then deletes
// it. In memory and ephemeral, it leaves nothing in the store.
func probe(ctx context.Context, stream jetstream.Stream, cfg jetstream.ConsumerConfig) (*jetstream.ConsumerInfo, error) {
	cfg.AckPolicy = jetstream.AckNonePolicy
	cfg.MemoryStorage = true
	cfg.InactiveThreshold = time.Minute
	cons, err := stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	info := cons.CachedInfo()
	// A consumer left behind expires by InactiveThreshold; nothing to undo.
	_ = stream.DeleteConsumer(ctx, info.Name)
	return info, nil
}
