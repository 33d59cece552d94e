package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/store"
)

// The defaults of Options.DigestEvery and DigestInterval.
const (
	defaultDigestEvery    = 1000
	defaultDigestInterval = time.Minute
)

// journalDigests keeps the journal's running digest (events.Chain) and
// journals it as a journal.digest event once every records have come
// since the last one, or interval has passed with any: what a copy of the
// journal is held to, record by record, by `fleet status` and `replay
// verify --nats`. A digest event alone does not call for another. The
// returned function stops it and waits for it.
//
// The chain always starts at the journal's first record, so a daemon
// started on an existing journal journals digests comparable with those
// before it; the digests already journaled are checked against the
// records they cover as they are read (digester).
func journalDigests(ctx context.Context, n *store.Store, every int, interval time.Duration) (stop func()) {
	if every <= 0 {
		every = defaultDigestEvery
	}
	if interval <= 0 {
		interval = defaultDigestInterval
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var d digester
		last := time.Now()
		tick := time.NewTicker(min(interval, time.Second))
		defer tick.Stop()
		for {
			err := n.Journal().Read(ctx, d.chain.Seq+1, "", func(r journal.Record) error {
				if err := d.take(r); err != nil {
					slog.Error(fmt.Sprintf("journal digest: %v", err), "component", "digest")
				}
				return nil
			})
			if err != nil && ctx.Err() == nil {
				slog.Warn(fmt.Sprintf("journal digest: read after %d: %v", d.chain.Seq, err), "component", "digest")
			}
			if d.pending >= every || d.pending > 0 && time.Since(last) >= interval {
				e := events.New(ulid.Make(), time.Now(), "", events.JournalDigestEvent{Seq: d.chain.Seq, Digest: d.chain.Digest()})
				actx, acancel := context.WithTimeout(ctx, 30*time.Second)
				if _, err := n.Append(actx, e); err != nil && ctx.Err() == nil {
					slog.Warn(fmt.Sprintf("journal %s: %v", e.Type, err), "component", "digest")
				} else if err == nil {
					d.pending, last = 0, time.Now()
				}
				acancel()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// digestWindow is how many of the chain's last steps a digester keeps: a
// journal.digest covers the records read just before it was appended, so
// only the few appended meanwhile lie between the two.
const digestWindow = 256

// digestSubject is the journal subject of journal.digest events.
var digestSubject, _ = events.Subject(events.JournalDigest, "")

// digester is the journal read in order from its first record: the
// running chain, how many records other than digests came after the last
// journaled digest's span (pending), and the chain's last steps, against
// which each journaled digest it reads is checked.
type digester struct {
	chain   events.Chain
	pending int
	others  int // records other than digests taken
	recent  [digestWindow]digestStep
}

// digestStep is the chain after the record at seq, and how many
// non-digest records it had taken then.
type digestStep struct {
	seq    uint64
	digest string
	others int
}

// take adds the record r, the next in the journal. A journal.digest whose
// digest is not the chain's at its sequence is an error (the records it
// covers changed since it was journaled, or it names a sequence past
// itself); the chain goes on from the records as they are.
func (d *digester) take(r journal.Record) error {
	var err error
	if r.Subject == digestSubject {
		err = d.check(r)
	}
	d.chain.Add(r.Seq, r.Data)
	if r.Subject != digestSubject {
		d.others++
		d.pending++
	}
	d.recent[r.Seq%digestWindow] = digestStep{seq: r.Seq, digest: d.chain.Digest(), others: d.others}
	return err
}

// check holds the journal.digest record r to the chain so far, and counts
// as pending only the records after the span it covers.
func (d *digester) check(r journal.Record) error {
	e, err := events.Decode(r.Data)
	if err != nil {
		return fmt.Errorf("the digest at %d: %w", r.Seq, err)
	}
	dg, _ := e.Payload.(events.JournalDigestEvent)
	if dg.Seq == 0 || dg.Seq >= r.Seq {
		return fmt.Errorf("the digest at %d covers records 1 to %d, not records before it", r.Seq, dg.Seq)
	}
	step := d.recent[dg.Seq%digestWindow]
	if step.seq != dg.Seq {
		// Too far back to check here; the mirror checks hold copies to it.
		d.pending = 0
		return nil
	}
	d.pending = d.others - step.others
	if step.digest != dg.Digest {
		return fmt.Errorf("the digest at %d says records 1 to %d hash to %.16s…, they hash to %.16s…: the journal changed after it was digested", r.Seq, dg.Seq, dg.Digest, step.digest)
	}
	return nil
}
