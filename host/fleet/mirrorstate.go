package fleet

import (
	"context"
	"time"

	"github.com/nexus-sandbox/nexus/host/fleetstate"

	"github.com/nats-io/nats.go/jetstream"
)

// MirrorState is the mirror as the host sees it now (host/fleetstate,
// which the daemon's clients read without linking the fleet's adapter).
type MirrorState = fleetstate.MirrorState

// State reports the mirror now. It asks the fleet, so it waits at most a
// few seconds.
func (m *Mirror) State(ctx context.Context) *MirrorState {
	st := &MirrorState{Host: m.Host, HostID: m.HostID, Stream: m.StreamName(), Domain: m.Domain, URLs: m.Redacted()}
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
	if info.Mirror != nil && info.Mirror.Error != nil && st.LastError == "" {
		st.LastError = info.Mirror.Error.Error()
	}
	return st
}
