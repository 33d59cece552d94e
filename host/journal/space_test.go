package journal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/smallfs"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

func openSpace(t *testing.T, dir string, sp Space) *Journal {
	t.Helper()
	j, err := Open(context.Background(), Options{Dir: dir, Space: &sp})
	if err != nil {
		t.Fatalf("Open %s: %v", dir, err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

func appendOne(j *Journal, i int, size int, reserve bool) error {
	_, err := j.Append(context.Background(), Message{
		Subject: fmt.Sprintf("nexus.events.sandbox.created.s%d", i%3),
		ID:      fmt.Sprintf("m-%d", i),
		Data:    append([]byte(fmt.Sprintf("event %d ", i)), make([]byte, size)...),
		Reserve: reserve,
	})
	return err
}

func wantNoSpace(t *testing.T, err error, mnt string) {
	t.Helper()
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("append error = %v, want ErrNoSpace", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "no space left") || !strings.Contains(msg, "mounted at "+mnt+" ") || strings.Contains(msg, "\n") {
		t.Fatalf("error %q: want one line naming the filesystem mounted at %s and \"no space left\"", msg, mnt)
	}
}

// TestSpaceReserve: below the reserve only appends that free space are
// admitted, below the floor none, and once space is freed every append
// works again in the same process.
func TestSpaceReserve(t *testing.T) {
	mnt := smallfs.Mount(t, 48<<20)
	j := openSpace(t, filepath.Join(mnt, "journal"), Space{Reserve: 16 << 20, Floor: 4 << 20})
	for i := range 5 {
		if err := appendOne(j, i, 100, false); err != nil {
			t.Fatal(err)
		}
	}
	filler := smallfs.Fill(t, mnt, 8<<20)
	if free := smallfs.Free(t, mnt); free >= 16<<20 || free < 4<<20 {
		t.Fatalf("filled to %d bytes free; the test needs between floor and reserve", free)
	}
	err := appendOne(j, 5, 100, false)
	wantNoSpace(t, err, mnt)
	t.Logf("refused: %v", err)
	if got := readAll(t, j, 1, Subjects); len(got) != 5 {
		t.Fatalf("read %d records while short of space, want 5", len(got))
	}
	if err := appendOne(j, 6, 100, true); err != nil {
		t.Fatalf("an append that frees space was refused above the floor: %v", err)
	}
	filler2 := smallfs.Fill(t, mnt, 1<<20)
	err = appendOne(j, 7, 100, true)
	wantNoSpace(t, err, mnt)
	if !strings.Contains(err.Error(), "even rm, reap and recover") {
		t.Fatalf("below the floor the error should say even freeing operations are refused: %v", err)
	}
	os.Remove(filler2)
	os.Remove(filler)
	if err := appendOne(j, 8, 100, false); err != nil {
		t.Fatalf("append after space was freed: %v", err)
	}
	got := readAll(t, j, 1, Subjects)
	if len(got) != 7 || got[5].MsgID != "m-6" || got[6].MsgID != "m-8" {
		t.Fatalf("journal holds %d records (%v), want m-0..m-4, m-6, m-8", len(got), got)
	}
}

// TestStoreWriteFailureReopens: with the space check off, the filestore
// itself hits ENOSPC. nats-server then refuses every later write of the
// stream (without an answer) until JetStream restarts; the journal must
// name the full filesystem, keep reading, and take appends again once
// space is freed, without being closed.
func TestStoreWriteFailureReopens(t *testing.T) {
	mnt := smallfs.Mount(t, 32<<20)
	j := openSpace(t, filepath.Join(mnt, "journal"), Space{})
	for i := range 5 {
		if err := appendOne(j, i, 100, false); err != nil {
			t.Fatal(err)
		}
	}
	filler := smallfs.Fill(t, mnt, 0)
	var err error
	acked := 5
	for i := 5; i < 5000 && err == nil; i++ {
		if err = appendOne(j, i, 4000, false); err == nil {
			acked++
		}
	}
	wantNoSpace(t, err, mnt)
	t.Logf("after %d acked appends: %v", acked, err)
	if got := readAll(t, j, 1, Subjects); len(got) != acked {
		t.Fatalf("read %d records on a full disk, want the %d acked", len(got), acked)
	}
	os.Remove(filler)
	for i := 10000; i < 10003; i++ {
		if err := appendOne(j, i, 100, false); err != nil {
			t.Fatalf("append %d after space was freed: %v", i, err)
		}
	}
	if got := readAll(t, j, 1, Subjects); len(got) != acked+3 || got[len(got)-1].MsgID != "m-10002" {
		// Say what the stream reports, to tell a read problem from a lost
		// state.
		info, ierr := j.currentStream().Info(context.Background())
		again := readAll(t, j, 1, Subjects)
		if ierr == nil {
			t.Fatalf("read %d records after recovery, want %d ending in m-10002 (stream state %+v; a second read: %d)", len(got), acked+3, info.State, len(again))
		}
		t.Fatalf("read %d records after recovery, want %d ending in m-10002 (stream info: %v; a second read: %d)", len(got), acked+3, ierr, len(again))
	}
	if j.reopened != 1 {
		t.Fatalf("store reopened %d times, want 1", j.reopened)
	}
	dir := j.Dir()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j2 := openSpace(t, dir, Space{})
	if got := readAll(t, j2, 1, Subjects); len(got) != acked+3 {
		t.Fatalf("after reopening from disk: %d records, want %d", len(got), acked+3)
	}
}

// TestStoreLimitFollowsTheDisk: a journal opened while its disk was nearly
// full must keep growing once space is freed. Left to itself, nats-server
// caps the store at 75% of the space free at start.
func TestStoreLimitFollowsTheDisk(t *testing.T) {
	mnt := smallfs.Mount(t, 48<<20)
	filler := smallfs.Fill(t, mnt, 2<<20)
	j := openSpace(t, filepath.Join(mnt, "journal"), Space{})
	os.Remove(filler)
	for i := range 120 {
		if err := appendOne(j, i, 32<<10, false); err != nil {
			t.Fatalf("append %d (%d KiB in the journal) after space was freed: %v", i, i*32, err)
		}
	}
}

// TestFollowSurvivesReopen: a follower started before the store broke
// receives the records appended after it was reopened.
func TestFollowSurvivesReopen(t *testing.T) {
	testutil.SkipInShort(t, "waits for the ordered consumer to miss heartbeats across a reopen")
	mnt := smallfs.Mount(t, 32<<20)
	j := openSpace(t, filepath.Join(mnt, "journal"), Space{})
	if err := appendOne(j, 0, 100, false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 10000)
	done := make(chan error, 1)
	go func() {
		done <- j.Follow(ctx, 1, Subjects, func(r Record) error { got <- r.MsgID; return nil })
	}()
	if id := <-got; id != "m-0" {
		t.Fatalf("first followed record %s", id)
	}
	filler := smallfs.Fill(t, mnt, 0)
	var err error
	for i := 1; i < 5000 && err == nil; i++ {
		err = appendOne(j, i, 4000, false)
	}
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("filling the disk: %v", err)
	}
	os.Remove(filler)
	if err := appendOne(j, 20000, 100, false); err != nil {
		t.Fatalf("append after space was freed: %v", err)
	}
	// A generous bound, not a timing claim: the ordered consumer notices
	// the restarted JetStream by missed heartbeats and recreates itself.
	deadline := time.After(testutil.Scale(3 * time.Minute))
	for {
		select {
		case id := <-got:
			if id == "m-20000" {
				return
			}
		case err := <-done:
			t.Fatalf("Follow ended across the reopen: %v", err)
		case <-deadline:
			t.Fatal("the follower never received the record appended after the reopen")
		}
	}
}

// BenchmarkCheckSpace is the free-space check each append pays (one
// statfs); compare with BenchmarkAppendSynced.
func BenchmarkCheckSpace(b *testing.B) {
	j := &Journal{dir: b.TempDir(), space: DefaultSpace(1 << 40)}
	for b.Loop() {
		if err := j.checkSpace(false); err != nil {
			b.Fatal(err)
		}
	}
}
