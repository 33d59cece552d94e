package journal

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// Every append path fsyncs the store before it acknowledges, and a group
// or a batch costs one fsync however many messages it holds.
func TestEveryAppendPathSyncsOnceBeforeItsAck(t *testing.T) {
	ctx := context.Background()
	j := openTest(t, t.TempDir())
	step := func(name string, want int, fn func() error) {
		t.Helper()
		before := j.Syncs()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := j.Syncs() - before; got != want {
			t.Fatalf("%s: %d fsyncs, want %d", name, got, want)
		}
	}
	step("Append", 1, func() error {
		_, err := j.Append(ctx, batchMsg("nexus.events.sandbox.created.A", "a1"))
		return err
	})
	step("AppendGroup of 20", 1, func() error {
		var msgs []Message
		for i := 0; i < 20; i++ {
			msgs = append(msgs, batchMsg("nexus.events.sandbox.created.B", fmt.Sprint("g", i)))
		}
		acks, err := j.AppendGroup(ctx, 1, msgs)
		if err == nil && (len(acks) != 20 || acks[0].Seq != 2 || acks[19].Seq != 21) {
			err = fmt.Errorf("acks %+v", acks)
		}
		return err
	})
	step("AppendBatch of 5", 1, func() error {
		var msgs []Message
		for i := 0; i < 5; i++ {
			msgs = append(msgs, batchMsg("nexus.events.sandbox.created.C", fmt.Sprint("b", i)))
		}
		_, err := j.AppendBatch(ctx, msgs)
		return err
	})
	// The server itself no longer fsyncs: that is what lets appends share.
	if so, err := serverOptions(j.dir, Options{}, "x"); err != nil || so.SyncAlways {
		t.Fatal("the server runs with SyncAlways: appends would not share fsyncs")
	}
}

// A refused message stops a group there: the messages before it are
// stored and acknowledged, none after it is stored.
func TestAppendGroupStopsAtTheFirstRefusal(t *testing.T) {
	ctx := context.Background()
	j := openTest(t, t.TempDir())
	appendN(t, j, 0, 3) // s0 at 1, s1 at 2, s2 at 3
	msgs := []Message{
		batchMsg("nexus.events.saga.started.X", "x1"),
		batchMsg("nexus.events.saga.started.s1", "x2"),
		batchMsg("nexus.events.saga.started.Y", "x3"),
		batchMsg("nexus.events.saga.started.Z", "x4"),
	}
	msgs[1].ExpectSubjects, msgs[1].ExpectSubjectSeq = "nexus.events.*.*.s1", 1 // s1's last is 2
	acks, err := j.AppendGroup(ctx, 3, msgs)
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || len(acks) != 1 || acks[0].Seq != 4 {
		t.Fatalf("AppendGroup = %+v, %v; want x1 stored at 4, then the refusal", acks, err)
	}
	recs := readAll(t, j, 1, Subjects)
	if len(recs) != 4 || recs[3].MsgID != "x1" {
		t.Fatalf("journal holds %d records (last %q), want 4 ending with x1", len(recs), recs[len(recs)-1].MsgID)
	}
	// The refused ones were not stored, so they append afterwards.
	if _, err := j.AppendGroup(ctx, 4, msgs[2:]); err != nil {
		t.Fatal(err)
	}
}

// When the store rolls over to a new block, the sync covers that block
// and the directory entry that names it.
func TestSyncFollowsANewBlock(t *testing.T) {
	ctx := context.Background()
	j := openTest(t, t.TempDir())
	big := make([]byte, 900<<10)
	for i := 0; ; i++ {
		if i > 40 {
			t.Fatal("no second block after 40 appends of 900 KiB")
		}
		if _, err := j.Append(ctx, Message{Subject: "nexus.events.sandbox.created.A", ID: fmt.Sprint("big", i), Data: big}); err != nil {
			t.Fatal(err)
		}
		blocks, err := filepath.Glob(filepath.Join(j.msgsDir(), "*.blk"))
		if err != nil {
			t.Fatal(err)
		}
		if len(blocks) < 2 {
			continue
		}
		j.synced.mu.Lock()
		block, dir := j.synced.block, j.synced.dir
		j.synced.mu.Unlock()
		if block != uint64(len(blocks)) || !dir {
			t.Fatalf("after the store made block %d, the last sync covered up to block %d (directory synced: %v)", len(blocks), block, dir)
		}
		return
	}
}
