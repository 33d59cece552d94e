package journal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func openTest(t *testing.T, dir string) *Journal {
	t.Helper()
	j, err := Open(context.Background(), Options{Dir: dir})
	if err != nil {
		t.Fatalf("Open %s: %v", dir, err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

func appendN(t testing.TB, j *Journal, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if _, err := j.Append(context.Background(), Message{
			Subject: fmt.Sprintf("nexus.events.sandbox.created.s%d", i%3),
			ID:      fmt.Sprintf("m-%d", i),
			Data:    []byte(fmt.Sprintf("event %d", i)),
		}); err != nil {
			t.Fatal(err)
		}
	}
}

func readAll(t *testing.T, j *Journal, from uint64, filter string) []Record {
	t.Helper()
	var out []Record
	if err := j.Read(context.Background(), from, filter, func(r Record) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestAppendReadAndReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	j := openTest(t, dir)
	if got := readAll(t, j, 1, Subjects); len(got) != 0 {
		t.Fatalf("new journal has %d records", len(got))
	}
	appendN(t, j, 0, 10)
	recs := readAll(t, j, 1, Subjects)
	if len(recs) != 10 {
		t.Fatalf("read %d records, want 10", len(recs))
	}
	for i, r := range recs {
		if r.Seq != uint64(i+1) || r.MsgID != fmt.Sprintf("m-%d", i) || string(r.Data) != fmt.Sprintf("event %d", i) {
			t.Fatalf("record %d = %+v", i, r)
		}
	}
	if got := readAll(t, j, 4, "nexus.events.*.*.s1"); len(got) != 2 || got[0].Seq != 5 || got[1].Seq != 8 {
		t.Fatalf("filtered tail read = %+v", got)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j2 := openTest(t, dir)
	if got := readAll(t, j2, 1, Subjects); len(got) != 10 {
		t.Fatalf("after reopen: %d records, want 10", len(got))
	}
	r, err := j2.Get(context.Background(), 3)
	if err != nil || r.MsgID != "m-2" || string(r.Data) != "event 2" {
		t.Fatalf("Get(3) = %+v, %v", r, err)
	}
}

func TestAppendDeduplicatesByID(t *testing.T) {
	j := openTest(t, t.TempDir())
	m := Message{Subject: "nexus.events.sandbox.created._", ID: "same", Data: []byte("x")}
	first, err := j.Append(context.Background(), m)
	if err != nil || first.Duplicate {
		t.Fatalf("first append = %+v, %v", first, err)
	}
	again, err := j.Append(context.Background(), m)
	if err != nil || !again.Duplicate || again.Seq != first.Seq {
		t.Fatalf("retried append = %+v, %v; want duplicate of seq %d", again, err, first.Seq)
	}
	if n := len(readAll(t, j, 1, Subjects)); n != 1 {
		t.Fatalf("%d records stored, want 1", n)
	}
}

func TestExpectedLastSequence(t *testing.T) {
	ctx := context.Background()
	j := openTest(t, t.TempDir())
	zero := uint64(0)
	a, err := j.Append(ctx, Message{Subject: "nexus.events.saga.started._", ID: "a", Data: []byte("a"), ExpectLastSeq: &zero})
	if err != nil || a.Seq != 1 {
		t.Fatalf("append at 0 = %+v, %v", a, err)
	}
	// A second writer that also believes the journal is empty must lose.
	_, err = j.Append(ctx, Message{Subject: "nexus.events.saga.started._", ID: "b", Data: []byte("b"), ExpectLastSeq: &zero})
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("interleaved append = %v, want ErrConflict", err)
	}
	// The first writer retrying its own append after a crash is not a
	// conflict: the server checks the sequence before the id, so Append must
	// find the id itself.
	retry, err := j.Append(ctx, Message{Subject: "nexus.events.saga.started._", ID: "a", Data: []byte("a"), ExpectLastSeq: &zero})
	if err != nil || !retry.Duplicate || retry.Seq != 1 {
		t.Fatalf("retry = %+v, %v; want duplicate at 1", retry, err)
	}
	if n := len(readAll(t, j, 1, Subjects)); n != 1 {
		t.Fatalf("%d records, want 1", n)
	}
}

func TestSecondOpenIsRefused(t *testing.T) {
	dir := t.TempDir()
	openTest(t, dir)
	_, err := Open(context.Background(), Options{Dir: dir})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
}

func TestNewerFormatIsRefusedUntouched(t *testing.T) {
	dir := t.TempDir()
	j := openTest(t, dir)
	appendN(t, j, 0, 3)
	j.Close()
	stamp := []byte("nexus-journal 99\n")
	if err := os.WriteFile(filepath.Join(dir, formatFile), stamp, 0o600); err != nil {
		t.Fatal(err)
	}
	before := treeDigest(t, dir)
	_, err := Open(context.Background(), Options{Dir: dir})
	if !errors.Is(err, ErrNewerFormat) {
		t.Fatalf("Open = %v, want ErrNewerFormat", err)
	}
	if after := treeDigest(t, dir); after != before {
		t.Fatalf("refused open changed the store:\n%s\n---\n%s", before, after)
	}
}

func TestFollowSeesNewRecords(t *testing.T) {
	j := openTest(t, t.TempDir())
	appendN(t, j, 0, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan Record, 10)
	done := make(chan error, 1)
	go func() {
		done <- j.Follow(ctx, 2, Subjects, func(r Record) error { got <- r; return nil })
	}()
	if r := <-got; r.Seq != 2 {
		t.Fatalf("first followed record seq %d, want 2", r.Seq)
	}
	appendN(t, j, 2, 1)
	if r := <-got; r.Seq != 3 {
		t.Fatalf("followed record seq %d, want 3", r.Seq)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Follow returned %v after cancel", err)
	}
}

// treeDigest lists every file under dir with its size and content hash.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	out := ""
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out += fmt.Sprintf("%s %d %x\n", p, len(data), sum(data))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sum(b []byte) uint64 {
	var h uint64 = 14695981039346656037
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

// The journal itself refuses an append whose decision saw an older record
// on the entity's subjects, even when the stream-wide check passes.
func TestExpectedLastSubjectSequenceOverAWildcard(t *testing.T) {
	ctx := context.Background()
	j := openTest(t, t.TempDir())
	put := func(subj, id string, m Message) (Ack, error) {
		m.Subject, m.ID, m.Data = subj, id, []byte(id)
		return j.Append(ctx, m)
	}
	if _, err := put("nexus.events.sandbox.created.A", "1", Message{}); err != nil {
		t.Fatal(err)
	}
	if _, err := put("nexus.events.sandbox.created.B", "2", Message{}); err != nil {
		t.Fatal(err)
	}
	// A's last record is 1, whatever B did since.
	if _, err := put("nexus.events.saga.started.A", "3", Message{ExpectSubjects: "nexus.events.*.*.A", ExpectSubjectSeq: 1}); err != nil {
		t.Fatalf("fresh expectation refused: %v", err)
	}
	last := uint64(3)
	_, err := put("nexus.events.saga.started.A", "4", Message{ExpectSubjects: "nexus.events.*.*.A", ExpectSubjectSeq: 1, ExpectLastSeq: &last})
	if !errors.Is(err, ErrStaleSubject) {
		t.Fatalf("stale expectation (with the stream check passing) = %v, want ErrStaleSubject", err)
	}
	_, err = put("nexus.events.saga.started.C", "5", Message{ExpectSubjects: "nexus.events.*.*.C", ExpectSubjectSeq: 2})
	if !errors.Is(err, ErrStaleSubject) {
		t.Fatalf("expectation on an entity with no records = %v, want ErrStaleSubject", err)
	}
	if _, err := put("nexus.events.saga.started.C", "6", Message{ExpectSubjects: "nexus.events.*.*.C", ExpectSubjectSeq: 0}); err != nil {
		t.Fatalf("first record of a new entity refused: %v", err)
	}
	if n := len(readAll(t, j, 1, Subjects)); n != 4 {
		t.Fatalf("%d records, want 4", n)
	}
}

// A listener the server cannot open fails Open at once, naming the address
// and the kernel's reason, instead of a generic timeout after 30 s.
func TestOpenReportsBusyListenAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j, err := Open(ctx, Options{Dir: t.TempDir(), Listen: addr, Subscriber: &Credentials{User: "sub", PasswordHash: "x"}})
	if err == nil {
		j.Close()
		t.Fatalf("Open with a busy listen address %s succeeded", addr)
	}
	if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("error does not name the address and the reason: %v", err)
	}
}
