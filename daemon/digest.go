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
func journalDigests(ctx context.Context, n *store.Store, every int, interval time.Duration) (stop func()) {
	if every <= 0 {
		every = defaultDigestEvery
	}
	if interval <= 0 {
		interval = defaultDigestInterval
	}
	subject, _ := events.Subject(events.JournalDigest, "")
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var chain events.Chain
		pending, last := 0, time.Now()
		tick := time.NewTicker(min(interval, time.Second))
		defer tick.Stop()
		for {
			err := n.Journal().Read(ctx, chain.Seq+1, "", func(r journal.Record) error {
				chain.Add(r.Seq, r.Data)
				if r.Subject != subject {
					pending++
				}
				return nil
			})
			if err != nil && ctx.Err() == nil {
				slog.Warn(fmt.Sprintf("journal digest: read after %d: %v", chain.Seq, err), "component", "digest")
			}
			if pending >= every || pending > 0 && time.Since(last) >= interval {
				e := events.New(ulid.Make(), time.Now(), "", events.JournalDigestEvent{Seq: chain.Seq, Digest: chain.Digest()})
				actx, acancel := context.WithTimeout(ctx, 30*time.Second)
				if _, err := n.Append(actx, e); err != nil && ctx.Err() == nil {
					slog.Warn(fmt.Sprintf("journal %s: %v", e.Type, err), "component", "digest")
				} else if err == nil {
					pending, last = 0, time.Now()
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
