package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/host/journal"
)

// The checks a mirror is held to against its host's journal.
const (
	CheckFirstSeq = "first_seq" // it starts at 1, as a journal does
	CheckCount    = "count"     // it holds every record from 1 to its last
	CheckLastSeq  = "last_seq"  // it ends where the host's journal (or report) does
	CheckDigest   = "digest"    // its records hash to the host's journaled digest
)

// FailedCheck is one check a mirror failed, and what each side holds.
type FailedCheck = fleetstate.FailedCheck

// ErrMirrorCheck is a mirror that failed a check against its host.
var ErrMirrorCheck = errors.New("fleet: the mirror is not its host's journal")

// hostWord is what a mirror is compared with: the host's journal's last
// sequence, whether the mirror may trail it (a live host's journal runs
// ahead of its copy; a report is a point the copy must reach), and the
// host's last journaled digest (Seq 0: none yet).
type hostWord struct {
	lastSeq  uint64
	mayTrail bool
	digest   events.JournalDigestEvent
}

// spanChecks are the checks a mirror's stream state alone decides.
func spanChecks(st jetstream.StreamState, host hostWord) []FailedCheck {
	var out []FailedCheck
	if st.Msgs == 0 {
		if host.mayTrail {
			return nil // nothing copied yet
		}
		return append(out, FailedCheck{Check: CheckCount, Detail: "the mirror is empty: it holds none of the host's journal"})
	}
	if st.FirstSeq != 1 {
		out = append(out, FailedCheck{Check: CheckFirstSeq, Detail: fmt.Sprintf("the mirror starts at %d, the journal at 1: its head is missing", st.FirstSeq)})
	}
	if st.Msgs != st.LastSeq {
		out = append(out, FailedCheck{Check: CheckCount, Detail: fmt.Sprintf("the mirror holds %d records up to %d, the journal %d: %d are missing", st.Msgs, st.LastSeq, st.LastSeq, st.LastSeq-min(st.Msgs, st.LastSeq))})
	}
	switch {
	case st.LastSeq > host.lastSeq && host.mayTrail:
		out = append(out, FailedCheck{Check: CheckLastSeq, Detail: fmt.Sprintf("the mirror ends at %d, after the host's journal (%d)", st.LastSeq, host.lastSeq)})
	case st.LastSeq < host.lastSeq && !host.mayTrail:
		out = append(out, FailedCheck{Check: CheckLastSeq, Detail: fmt.Sprintf("the mirror ends at %d, but its host reported its journal at %d: it is truncated or behind", st.LastSeq, host.lastSeq)})
	}
	return out
}

// digestCheck compares the mirror's chain up to the host's digest with
// that digest; a digest past the mirror's last sequence is not yet
// checkable and passes.
func digestCheck(chain events.Chain, host hostWord) []FailedCheck {
	d := host.digest
	if d.Seq == 0 || chain.Seq < d.Seq || chain.Digest() == d.Digest {
		return nil
	}
	return []FailedCheck{{Check: CheckDigest, Detail: fmt.Sprintf("the mirror's records 1 to %d hash to %.16s…, the host journaled %.16s…", d.Seq, chain.Digest(), d.Digest)}}
}

// digestSubject is the journal subject of journal.digest events.
var digestSubject, _ = events.Subject(events.JournalDigest, "")

// lastDigest is the newest journal.digest event in j (Seq 0: none).
func lastDigest(ctx context.Context, j *journal.Journal) (events.JournalDigestEvent, error) {
	seq, err := j.LastOnSubject(ctx, digestSubject)
	if err != nil || seq == 0 {
		return events.JournalDigestEvent{}, err
	}
	r, err := j.Get(ctx, seq)
	if err != nil {
		return events.JournalDigestEvent{}, err
	}
	e, err := events.Decode(r.Data)
	if err != nil {
		return events.JournalDigestEvent{}, fmt.Errorf("journal digest at %d: %w", seq, err)
	}
	d, _ := e.Payload.(events.JournalDigestEvent)
	return d, nil
}

// chainTo is the chain over stream's records 1 to seq.
func chainTo(ctx context.Context, s jetstream.Stream, seq uint64) (events.Chain, error) {
	return chainFrom(ctx, s, events.Chain{}, seq)
}

// chainFrom is c carried on over stream's records after c.Seq up to seq.
func chainFrom(ctx context.Context, s jetstream.Stream, c events.Chain, seq uint64) (events.Chain, error) {
	// By sequence, as an auditor reads: the host reaches the fleet's
	// JetStream API over its leaf link, and no consumer's deliveries.
	for n := c.Seq + 1; n <= seq; n++ {
		m, err := s.GetMsg(ctx, n)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // a gap, which the count check names
		}
		if err != nil {
			return c, fmt.Errorf("sequence %d: %w", n, err)
		}
		c.Add(m.Sequence, m.Data)
	}
	return c, nil
}

// chainCache is a mirror's chain as far as the last check read it, and
// which stream that was (its creation time): the next check reads only
// the records after it. A stream is never rewritten in place: a
// changed record means a stream made again, which is read from its
// start; a deleted one is the count check's.
type chainCache struct {
	mu      sync.Mutex
	created time.Time
	chain   events.Chain
}

// to is the chain over s's records 1 to seq; s was created at created.
func (cc *chainCache) to(ctx context.Context, s jetstream.Stream, created time.Time, seq uint64) (events.Chain, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	var from events.Chain
	if cc.created.Equal(created) && cc.chain.Seq <= seq {
		from = cc.chain
	}
	c, err := chainFrom(ctx, s, from, seq)
	if err != nil {
		return c, err
	}
	cc.created, cc.chain = created, c
	return c, nil
}

// checksError is the error for failed checks (nil: none failed).
func checksError(stream string, failed []FailedCheck) error {
	if len(failed) == 0 {
		return nil
	}
	s := make([]string, len(failed))
	for i, f := range failed {
		s[i] = f.String()
	}
	return fmt.Errorf("%w: mirror %s: %s", ErrMirrorCheck, stream, strings.Join(s, "; "))
}
