package logindex

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fixture is a log and its index in a temporary directory, watched with a
// clock the test moves.
type fixture struct {
	t          *testing.T
	log, index string
	now        time.Time
	w          *Watcher
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	x := &fixture{t: t, log: filepath.Join(dir, "c.log"), index: filepath.Join(dir, "c.idx"), now: time.Unix(1000, 0)}
	for _, p := range []string{x.log, x.index} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	x.w = &Watcher{Log: x.log, Index: x.index, Now: func() time.Time { return x.now }, Logf: t.Logf}
	return x
}

func (x *fixture) write(s string) {
	f, err := os.OpenFile(x.log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		x.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		x.t.Fatal(err)
	}
}

// tick moves the clock a second and looks.
func (x *fixture) tick() {
	x.now = x.now.Add(time.Second)
	x.w.Look()
}

func (x *fixture) records() []Record {
	b, err := os.ReadFile(x.index)
	if err != nil {
		x.t.Fatal(err)
	}
	var out []Record
	for i := 0; i+RecordSize <= len(b); i += RecordSize {
		r, err := decode(b[i : i+RecordSize])
		if err != nil {
			x.t.Fatalf("record %d: %v", i/RecordSize, err)
		}
		out = append(out, r)
	}
	return out
}

func (x *fixture) reader() *Reader {
	f, err := os.Open(x.index)
	if err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(func() { f.Close() })
	return NewReader(f)
}

func TestWatcherNotesGrowthOnly(t *testing.T) {
	x := newFixture(t)
	x.write("old boot\n")
	x.w.Look() // the first look takes the log as it stood, unrecorded
	x.tick()
	if n := len(x.records()); n != 0 {
		t.Fatalf("%d records of a log that did not change", n)
	}
	x.write("a\n")
	x.tick()
	x.tick()
	x.write("b\n")
	x.tick()
	want := []Record{{time.Unix(1002, 0), 11}, {time.Unix(1004, 0), 13}}
	if got := x.records(); !equal(got, want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	// A log begun anew (shorter than it was) begins its index anew.
	if err := os.WriteFile(x.log, []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	x.tick()
	if got, want := x.records(), []Record{{time.Unix(1005, 0), 4}}; !equal(got, want) {
		t.Fatalf("after the log began anew: %v, want %v", got, want)
	}
}

// A watcher started on an index with records (a supervisor restarted
// beside a running VMM) goes on from its newest record, cutting a torn one.
func TestWatcherResumes(t *testing.T) {
	x := newFixture(t)
	x.w.Look()
	x.write("a\n")
	x.tick()
	f, _ := os.OpenFile(x.index, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString("0000000000") // torn
	f.Close()
	x.write("bb\n") // written while no watcher ran
	x.w = &Watcher{Log: x.log, Index: x.index, Now: func() time.Time { return x.now }}
	x.tick()
	want := []Record{{time.Unix(1001, 0), 2}, {time.Unix(1002, 0), 5}}
	if got := x.records(); !equal(got, want) {
		t.Fatalf("records %v, want %v", got, want)
	}
}

// Run looks once more as it ends, so the last lines are held.
func TestWatcherRunLooksAtTheEnd(t *testing.T) {
	x := newFixture(t)
	x.w.Every = time.Hour
	x.w.Look()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); x.w.Run(ctx) }()
	x.write("last\n")
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not end with its context")
	}
	if got := x.records(); len(got) != 1 || got[0].Offset != 5 {
		t.Fatalf("records %v, want one at offset 5", got)
	}
}

func TestStampAndSince(t *testing.T) {
	x := newFixture(t)
	x.w.Look()
	x.write("a1\na2\n") // [0,6) seen at 1001
	x.tick()
	x.tick()
	x.tick()
	x.write("b1\nb") // seen at 1004, b's line in progress
	x.tick()
	x.write("\nc1\n") // [10,14) seen at 1005
	x.tick()
	x.write("tail\n") // [14,19) not yet seen
	mod := time.Unix(1005, 500)

	r := x.reader()
	lines := map[int64]int64{3: 1001, 6: 1001, 9: 1004, 11: 1005, 14: 1005, 19: 1005}
	for _, end := range []int64{3, 6, 9, 11, 14, 19} {
		got, err := r.Stamp(end, mod)
		if err != nil {
			t.Fatal(err)
		}
		want := time.Unix(lines[end], 0)
		if end == 19 {
			want = mod
		}
		if !got.Equal(want) {
			t.Errorf("line ending at %d stamped %v, want %v", end, got, want)
		}
	}
	// A line no record holds is never stamped before the newest record.
	r2 := x.reader()
	if got, _ := r2.Stamp(19, time.Unix(900, 0)); !got.Equal(time.Unix(1005, 0)) {
		t.Errorf("an unseen line with an old modification time stamped %v, want the newest record's time", got)
	}
	// From moves the reader as if the lines before were read.
	r3 := x.reader()
	if err := r3.From(6); err != nil {
		t.Fatal(err)
	}
	if got, _ := r3.Stamp(9, mod); !got.Equal(time.Unix(1004, 0)) {
		t.Errorf("after From(6), line ending at 9 stamped %v", got)
	}

	for _, c := range []struct {
		since   time.Time
		mod     time.Time
		off     int64
		fromEnd bool
	}{
		{time.Unix(0, 0), mod, 0, false},
		{time.Unix(1001, 0), mod, 0, false},
		{time.Unix(1002, 0), mod, 6, false}, // b's lines were seen at 1004
		{time.Unix(1004, 0), mod, 6, false},
		{time.Unix(1004, 1), mod, 10, false}, // inside b's second line: the caller starts at its start
		{time.Unix(1005, 1), mod, 14, false}, // only the unseen tail, modified since
		{time.Unix(1006, 0), mod, 0, true},   // nothing that recent
	} {
		off, fromEnd, err := x.reader().Since(c.since, c.mod)
		if err != nil || off != c.off || fromEnd != c.fromEnd {
			t.Errorf("Since(%v) = %d, %v, %v; want %d, %v", c.since.Unix(), off, fromEnd, err, c.off, c.fromEnd)
		}
	}
}

// A log without an index reads as one with no records: every line is
// stamped with the log's modification time.
func TestNoIndex(t *testing.T) {
	r := NewReader(nil)
	mod := time.Unix(50, 0)
	if got, err := r.Stamp(10, mod); err != nil || !got.Equal(mod) {
		t.Fatalf("Stamp without an index = %v, %v", got, err)
	}
	if off, fromEnd, err := r.Since(time.Unix(40, 0), mod); err != nil || off != 0 || fromEnd {
		t.Fatalf("Since before the modification = %d, %v, %v", off, fromEnd, err)
	}
	if _, fromEnd, _ := r.Since(time.Unix(60, 0), mod); !fromEnd {
		t.Fatal("Since after the modification does not start at the end")
	}
}

func TestCorruptRecordIsAnError(t *testing.T) {
	x := newFixture(t)
	if err := os.WriteFile(x.index, []byte(strings.Repeat("x", RecordSize)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := x.reader().Stamp(1, time.Now()); err == nil || !strings.Contains(err.Error(), "unreadable record") {
		t.Fatalf("a corrupt record read as %v", err)
	}
}

func equal(a, b []Record) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Time.Equal(b[i].Time) || a[i].Offset != b[i].Offset {
			return false
		}
	}
	return true
}
