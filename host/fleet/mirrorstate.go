package fleet

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/host/fleetstate"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/journal"
)

// MirrorState is the mirror as the host sees it now (host/fleetstate,
// which the daemon's clients read without linking the fleet's adapter).
type MirrorState = fleetstate.MirrorState

// State reports the mirror now. It asks the fleet, so it waits at most a
// few seconds.
func (m *Mirror) State(ctx context.Context) *MirrorState {
	st := &MirrorState{Host: m.Host, HostID: m.HostID, Stream: m.StreamName(), Domain: m.Domain, URLs: m.Redacted(), FailedChecks: []FailedCheck{}}
	r := m.current()
	if r == nil {
		return st // not started
	}
	r.mu.Lock()
	if r.err != nil {
		st.LastError = r.err.Error()
	}
	st.Drift = r.drift
	r.mu.Unlock()
	l := r.link
	st.Connected = l.Up()
	if l.Peers != nil {
		var names, addrs []string
		for _, p := range l.Peers() {
			names, addrs = append(names, p.Name), append(addrs, p.Addr)
		}
		st.LinkedNode, st.LinkedAddr = strings.Join(names, ","), strings.Join(addrs, ",")
	}

	var lastTime time.Time
	if last, err := l.Journal.LastSeq(ctx); err == nil {
		st.JournalLastSeq = last
		if r, err := l.Journal.Get(ctx, last); last > 0 && err == nil {
			lastTime = r.Time
		}
	}
	if !st.Connected {
		return st
	}
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	fleet, err := jetstream.NewWithDomain(l.Conn, m.Domain)
	if err != nil {
		st.LastError = err.Error()
		return st
	}
	s, err := fleet.Stream(qctx, st.Stream)
	if err != nil {
		st.LastError = err.Error()
		return st
	}
	info := s.CachedInfo()
	st.Exists = true
	st.Replicas = info.Config.Replicas
	st.MirrorLastSeq = info.State.LastSeq
	st.MirrorFirstSeq, st.MirrorMsgs = info.State.FirstSeq, info.State.Msgs
	if st.MirrorMsgs < st.MirrorLastSeq {
		st.MissingEvents = st.MirrorLastSeq - st.MirrorMsgs
	}
	if rep, err := readReport(qctx, fleet, m.Host, m.HostID); err == nil {
		st.ReportedSeq = rep.LastSeq
	} else if st.LastError == "" {
		st.LastError = err.Error()
	}
	st.LagEvents = st.MissingEvents
	if st.JournalLastSeq > st.MirrorLastSeq {
		st.LagEvents += st.JournalLastSeq - st.MirrorLastSeq
		if !info.State.LastTime.IsZero() && lastTime.After(info.State.LastTime) {
			st.LagSeconds = lastTime.Sub(info.State.LastTime).Seconds()
		} else if info.State.LastTime.IsZero() && !lastTime.IsZero() {
			// Nothing mirrored yet: the lag is the journal's whole age.
			if first, err := l.Journal.Get(ctx, 1); err == nil {
				st.LagSeconds = time.Since(first.Time).Seconds()
			}
		}
	}
	st.FailedChecks = contentChecks(ctx, l.Journal, s, info.Created, info.State, &m.chain, st)
	if info.Mirror != nil && info.Mirror.Error != nil && st.LastError == "" {
		st.LastError = info.Mirror.Error.Error()
	}
	return st
}

// contentChecks holds the mirror (stream s, in state ms) to the journal j:
// its span, and its records up to the journal's last digest, which it
// reads from the fleet. It sets st.DigestSeq to the digest checked.
func contentChecks(ctx context.Context, j *journal.Journal, s jetstream.Stream, created time.Time, ms jetstream.StreamState, cc *chainCache, st *MirrorState) []FailedCheck {
	out := []FailedCheck{}
	// The journal's last sequence read after the mirror's: a record
	// appended meanwhile may be in the mirror already.
	last, err := j.LastSeq(ctx)
	if err != nil {
		return out
	}
	d, err := lastDigest(ctx, j)
	if err != nil {
		st.LastError = cmp.Or(st.LastError, err.Error())
		return out
	}
	word := hostWord{lastSeq: last, mayTrail: true, digest: d}
	out = append(out, spanChecks(ms, word)...)
	if d.Seq == 0 || d.Seq > ms.LastSeq {
		return out
	}
	// The records up to the digest that no status read before are read
	// now (the first status reads them all): bounded on its own, not by
	// the few seconds the stream info gets.
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	chain, err := cc.to(rctx, s, created, d.Seq)
	if err != nil {
		st.LastError = cmp.Or(st.LastError, fmt.Sprintf("read the mirror to check its digest: %v", err))
		return out
	}
	st.DigestSeq = d.Seq
	return append(out, digestCheck(chain, word)...)
}
