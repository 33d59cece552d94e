package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
)

func openTestNode(t *testing.T) *Store {
	t.Helper()
	n, err := Open(context.Background(), t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func warning(sandbox string) events.Event {
	return events.New(ulid.Make(), time.Now(), sandbox, events.WarningRaisedEvent{Reason: "test"})
}

func created(sandbox string) events.Event {
	return events.New(ulid.Make(), time.Now(), sandbox, events.SandboxCreatedEvent{Image: "i", Driver: "process"})
}

type result struct {
	seqs []uint64
	err  error
}

// inOneGroup runs calls concurrently while the test holds the store's lock,
// so every one of them is queued before the committer can start: they are
// committed as one group. It returns each call's result, in order.
func inOneGroup(t *testing.T, n *Store, calls []func() ([]uint64, error)) []result {
	t.Helper()
	out := make([]result, len(calls))
	var wg sync.WaitGroup
	n.mu.Lock()
	for i, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seqs, err := call()
			out[i] = result{seqs, err}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n.gc.mu.Lock()
		queued := len(n.gc.queue)
		n.gc.mu.Unlock()
		if queued == len(calls) {
			break
		}
		if time.Now().After(deadline) {
			n.mu.Unlock()
			t.Fatalf("%d of %d calls queued after 10s", queued, len(calls))
		}
		time.Sleep(time.Millisecond)
	}
	n.mu.Unlock()
	wg.Wait()
	return out
}

// Concurrent appends about different sandboxes share one fsync; a stale
// decision among them is refused on its own, and the others are stored.
func TestGroupCommitSharesOneFsyncAndRefusesStaleAlone(t *testing.T) {
	ctx := context.Background()
	n := openTestNode(t)
	target := ulid.Make().String()
	first, err := n.Append(ctx, created(target))
	if err != nil {
		t.Fatal(err)
	}
	const writers = 16
	calls := make([]func() ([]uint64, error), 0, writers+2)
	sandboxes := make([]string, writers)
	for w := range sandboxes {
		sandboxes[w] = ulid.Make().String()
		calls = append(calls, func() ([]uint64, error) { return n.Append(ctx, created(sandboxes[w])) })
	}
	// Two decisions about target, both made on its state at first. They
	// touch the same sandbox, so the first queued goes in this group and the
	// other waits for the next and is refused there: it is stale by then.
	calls = append(calls,
		func() ([]uint64, error) {
			return n.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(target), Seq: first[0]}}, warning(target))
		},
		func() ([]uint64, error) {
			return n.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(target), Seq: first[0]}}, warning(target))
		},
	)
	syncs := n.Journal().Syncs()
	got := inOneGroup(t, n, calls)

	seen := map[uint64]bool{}
	for w := range sandboxes {
		r := got[w]
		if r.err != nil || len(r.seqs) != 1 || seen[r.seqs[0]] {
			t.Fatalf("writer %d: %v, %v", w, r.seqs, r.err)
		}
		seen[r.seqs[0]] = true
		if rev := n.Rev(core.Sandbox(sandboxes[w])); rev != r.seqs[0] {
			t.Fatalf("writer %d: Rev = %d, want its seq %d (not folded)", w, rev, r.seqs[0])
		}
	}
	// Which of the two queued first is up to the scheduler.
	fresh, stale := got[writers], got[writers+1]
	if fresh.err != nil {
		fresh, stale = stale, fresh
	}
	if fresh.err != nil {
		t.Fatalf("fresh decision refused: %v", fresh.err)
	}
	var se *core.StaleError
	if !errors.As(stale.err, &se) || se.Actual != fresh.seqs[0] {
		t.Fatalf("stale decision = %v, %v; want refused, target at %d", stale.seqs, stale.err, fresh.seqs[0])
	}
	// One fsync for the group of 17, one for the stale call's group, which
	// stores nothing and so syncs nothing.
	if d := n.Journal().Syncs() - syncs; d != 1 {
		t.Fatalf("%d fsyncs for one group of %d appends, want 1", d, writers+1)
	}
	last, err := n.Journal().LastSeq(ctx)
	if err != nil || last != uint64(writers+2) {
		t.Fatalf("journal last seq = %d, %v; want %d", last, err, writers+2)
	}
}

// A retried append (an id already stored) inside a group returns its
// original sequence and is not stored again; the appends behind it, which
// the journal refused because the stream did not move, are stored one by one.
func TestGroupCommitRetryInsideGroup(t *testing.T) {
	ctx := context.Background()
	n := openTestNode(t)
	again := warning(ulid.Make().String())
	first, err := n.Append(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	others := []events.Event{warning(ulid.Make().String()), warning(ulid.Make().String()), warning(ulid.Make().String())}
	calls := []func() ([]uint64, error){func() ([]uint64, error) { return n.Append(ctx, again) }}
	for _, e := range others {
		calls = append(calls, func() ([]uint64, error) { return n.Append(ctx, e) })
	}
	got := inOneGroup(t, n, calls)
	if got[0].err != nil || len(got[0].seqs) != 1 || got[0].seqs[0] != first[0] {
		t.Fatalf("retry = %v, %v; want the original seq %d", got[0].seqs, got[0].err, first[0])
	}
	for i, r := range got[1:] {
		if r.err != nil || len(r.seqs) != 1 {
			t.Fatalf("append %d behind the retry: %v, %v", i, r.seqs, r.err)
		}
	}
	var ids []ulid.ULID
	if err := n.Events(ctx, Query{}, func(r Record) error {
		ids = append(ids, r.Event.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1+len(others) {
		t.Fatalf("journal holds %d events, want %d (the retry stored once)", len(ids), 1+len(others))
	}
	if n.sandboxes.Seq() != uint64(len(ids)) {
		t.Fatalf("views folded to %d, journal at %d", n.sandboxes.Seq(), len(ids))
	}
}

// A saga step's events are one atomic batch, and a group of them with
// single appends keeps each call's sequences in its own order.
func TestGroupCommitSagaStepIsOneBatch(t *testing.T) {
	ctx := context.Background()
	n := openTestNode(t)
	sb := ulid.Make().String()
	made, err := n.Append(ctx, created(sb))
	if err != nil {
		t.Fatal(err)
	}
	saga := ulid.Make().String()
	step := func(p events.Payload, name string) events.Event {
		e := events.New(ulid.Make(), time.Now(), sb, p)
		e.Saga, e.Step = saga, name
		return e
	}
	calls := []func() ([]uint64, error){
		func() ([]uint64, error) {
			return n.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(sb), Seq: made[0]}},
				step(events.SagaStartedEvent{Kind: "rm"}, "start"),
				step(events.WarningRaisedEvent{Reason: "a"}, "a"),
				step(events.SagaFinishedEvent{}, "finish"),
				step(events.WarningRaisedEvent{Reason: "late"}, "late"))
		},
		func() ([]uint64, error) { return n.Append(ctx, warning(ulid.Make().String())) },
	}
	got := inOneGroup(t, n, calls)
	r := got[0]
	// The fourth event comes after the saga finished: refused, the three
	// before it stored, as one batch at consecutive sequences.
	if !errors.Is(r.err, core.ErrSagaClosed) || len(r.seqs) != 3 || r.seqs[1] != r.seqs[0]+1 || r.seqs[2] != r.seqs[1]+1 {
		t.Fatalf("saga step = %v, %v; want 3 consecutive seqs and ErrSagaClosed", r.seqs, r.err)
	}
	if got[1].err != nil {
		t.Fatal(got[1].err)
	}
	if n.Rev(core.Sandbox(sb)) != r.seqs[2] || n.sagas.Get(saga) != nil {
		t.Fatalf("views after the batch: Rev %d (want %d), saga open %v", n.Rev(core.Sandbox(sb)), r.seqs[2], n.sagas.Get(saga) != nil)
	}
}

// A call with more events than one atomic batch may hold is still stored,
// event by event.
func TestGroupCommitOversizedCall(t *testing.T) {
	ctx := context.Background()
	n := openTestNode(t)
	evs := make([]events.Event, journal.MaxBatch+1)
	for i := range evs {
		evs[i] = warning("")
	}
	seqs, err := n.Append(ctx, evs...)
	if err != nil || len(seqs) != len(evs) || seqs[len(seqs)-1] != uint64(len(evs)) {
		t.Fatalf("append of %d events: %d seqs, %v", len(evs), len(seqs), err)
	}
}

// Closing after a few appends leaves the snapshots alone once they exist;
// the next Open folds the tail from the journal instead.
func TestCloseRewritesSnapshotsOnlyPastTheMinimum(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	cycle := func(appends int) (*Store, []byte) {
		t.Helper()
		n, err := Open(ctx, root, Options{})
		if err != nil {
			t.Fatal(err)
		}
		evs := make([]events.Event, appends)
		for i := range evs {
			evs[i] = created(ulid.Make().String())
		}
		if _, err := n.Append(ctx, evs...); err != nil {
			t.Fatal(err)
		}
		path := n.snapshotPath(n.sagas)
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("after close: %v", err)
		}
		return n, data
	}
	_, first := cycle(1) // no snapshot yet: written
	_, second := cycle(2)
	if !bytes.Equal(first, second) {
		t.Fatal("Close after 2 appends rewrote the snapshots")
	}
	n, err := Open(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.sandboxes.count(); got != 3 {
		t.Fatalf("reopened: %d sandboxes, want 3 (the tail folded from the journal)", got)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	_, third := cycle(closeSnapshotMin)
	if bytes.Equal(first, third) {
		t.Fatalf("Close after a tail of %d events left the snapshots as they were", closeSnapshotMin+3)
	}
}

// Every acknowledgement comes after the fsync that covers it, also while
// the next group is published during this one's fsync: each writer, on
// its answer, finds its sequence at or below what the journal has synced.
func TestGroupCommitAcksOnlyAfterTheirFsync(t *testing.T) {
	n := openTestNode(t)
	ctx := context.Background()
	const writers, each = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := ulid.Make().String()
			for i := 0; i < each; i++ {
				seqs, err := n.Append(ctx, warning(sb))
				if err != nil {
					errs <- err
					return
				}
				if durable := n.j.DurableThrough(); seqs[0] > durable {
					errs <- fmt.Errorf("append acknowledged at seq %d while the journal had synced only through %d", seqs[0], durable)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if syncs := n.j.Syncs(); syncs >= writers*each {
		t.Fatalf("%d fsyncs for %d appends: nothing was grouped", syncs, writers*each)
	} else {
		t.Logf("%d appends, %d fsyncs", writers*each, syncs)
	}
}

// An append that got no answer is sent again with the same events after
// the journal's owner restarted (a daemon killed between the journal's ack
// and its reply): it is answered with the sequence it was stored at and
// stored once, with an expectation (which its own first attempt made
// stale) or without (the journal's message-id de-duplication, which
// survives the restart); another writer's stale expectation is refused.
func TestRetryOfAStoredAppendAfterReopen(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	n, err := Open(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sb := ulid.Make().String()
	first := created(sb)
	guarded := warning(sb)
	plain := warning(sb)
	if _, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(sb), Seq: 0}}, first); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{}
	for _, c := range []struct {
		name   string
		e      events.Event
		expect []core.Expect
	}{{"guarded", guarded, []core.Expect{{Entity: core.Sandbox(sb), Seq: 1}}}, {"plain", plain, nil}} {
		seqs, err := n.AppendExpect(ctx, c.expect, c.e)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want[c.name] = seqs[0]
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n, err = Open(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for _, c := range []struct {
		name   string
		e      events.Event
		expect []core.Expect
	}{{"guarded", guarded, []core.Expect{{Entity: core.Sandbox(sb), Seq: 1}}}, {"plain", plain, nil}} {
		seqs, err := n.AppendExpect(ctx, c.expect, c.e)
		if err != nil || len(seqs) != 1 || seqs[0] != want[c.name] {
			t.Fatalf("%s append sent again after a reopen: %v, %v; want its stored seq %d", c.name, seqs, err, want[c.name])
		}
	}
	_, err = n.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(sb), Seq: 1}}, warning(sb))
	var stale *core.StaleError
	if !errors.As(err, &stale) || stale.Actual != 3 {
		t.Fatalf("a new event on a stale expectation: %v; want refused as stale at 3", err)
	}
	var count int
	n.Events(ctx, Query{}, func(Record) error { count++; return nil })
	if count != 3 {
		t.Fatalf("journal holds %d events, want 3: a retry was stored twice", count)
	}
}

// Looking for a retry's own events behind a stale expectation reads the
// records on those events' subjects since the expectation, not the
// journal's: a stale volume decision behind 300 other events reads a few.
func TestStaleLookupReadsOnlyItsSubjects(t *testing.T) {
	n := openTestNode(t)
	ctx := context.Background()
	vol := func(name string) events.Event {
		return events.New(ulid.Make(), time.Now(), "", events.VolumeCreatedEvent{Name: name, Path: "/v/" + name, SizeBytes: 1})
	}
	if _, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("data"), Seq: 0}}, vol("data")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		if _, err := n.Append(ctx, warning(ulid.Make().String())); err != nil {
			t.Fatal(err)
		}
	}
	before := n.j.RecordsRead()
	_, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("data"), Seq: 0}}, vol("data"))
	var stale *core.StaleError
	if !errors.As(err, &stale) {
		t.Fatalf("a second create of the volume on a stale decision: %v, want stale", err)
	}
	if read := n.j.RecordsRead() - before; read > 5 {
		t.Fatalf("the stale check read %d journal records; the volume's subject holds 1", read)
	}
}
