package journal

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/nexus-sandbox/nexus/host/streamscan"
)

// TestScanReadsOnlyTheRange proves reads are positional: each range is
// delivered exactly, and the journal hands out no record outside it (the
// RecordsRead counter would show a read from the start).
func TestScanReadsOnlyTheRange(t *testing.T) {
	j := openTest(t, t.TempDir())
	appendN(t, j, 0, 300) // seq = i+1 on subject ...s<i%3>
	all := readAll(t, j, 1, Subjects)
	const s1 = "nexus.events.sandbox.created.s1" // seqs 2, 5, 8, ... 299
	cases := []struct {
		name string
		r    Range
		want []uint64
	}{
		{"tail", Range{Tail: 5}, []uint64{296, 297, 298, 299, 300}},
		{"tail of a subject", Range{Tail: 3, Filters: []string{s1}}, []uint64{293, 296, 299}},
		{"tail of a subject up to", Range{Tail: 2, To: 100, Filters: []string{s1}}, []uint64{95, 98}},
		{"two subjects from", Range{From: 290, Filters: []string{s1, "nexus.events.*.*.s2"}}, []uint64{290, 291, 293, 294, 296, 297, 299, 300}},
		{"between", Range{From: 10, To: 14}, []uint64{10, 11, 12, 13, 14}},
		{"between times", Range{FromTime: all[149].Time, ToTime: all[151].Time}, []uint64{150, 151, 152}},
		{"tail larger than the range", Range{From: 298, Tail: 10}, []uint64{298, 299, 300}},
		{"nothing after the end", Range{From: 301}, nil},
	}
	for _, c := range cases {
		before := j.RecordsRead()
		var got []uint64
		if err := j.Scan(context.Background(), c.r, func(r Record) error {
			got = append(got, r.Seq)
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(got) != len(c.want) {
			t.Fatalf("%s: got %v, want %v", c.name, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("%s: got %v, want %v", c.name, got, c.want)
			}
		}
		if read := j.RecordsRead() - before; read != uint64(len(c.want)) {
			t.Errorf("%s: read %d records to deliver %d", c.name, read, len(c.want))
		}
	}
	if err := j.Scan(context.Background(), Range{Follow: true, To: 5}, func(Record) error { return nil }); !errors.Is(err, ErrFollowBounded) {
		t.Fatalf("bounded follow: %v", err)
	}
}

// A read leaves no consumer on the journal: not a bounded one, not a
// filtered tail, not a follow that was cancelled (an ordered consumer
// would otherwise stay for its inactive threshold, minutes).
func TestScanLeavesNoConsumer(t *testing.T) {
	j := openTest(t, t.TempDir())
	appendN(t, j, 0, 20)
	ctx := context.Background()
	nop := func(Record) error { return nil }
	if err := j.Scan(ctx, Range{}, nop); err != nil {
		t.Fatal(err)
	}
	if err := j.Scan(ctx, Range{Filters: []string{"nexus.events.sandbox.created.s1"}, Tail: 3}, nop); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithCancel(ctx)
	seen := 0
	if err := j.Scan(fctx, Range{Follow: true}, func(Record) error {
		if seen++; seen == 20 {
			cancel()
		}
		return nil
	}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled follow: %v", err)
	}
	info, err := j.currentStream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Fatalf("%d consumers left on the journal after three reads", info.State.Consumers)
	}
}

// A tail is located by counts that start near the end: a count from a
// sequence makes the server load every block from there on, so a search
// that bisected the whole journal loaded half of it on the first count.
func TestTailCountsFromTheEnd(t *testing.T) {
	j := openTest(t, t.TempDir())
	appendN(t, j, 0, 300) // seq = i+1 on subject ...s<i%3>
	var starts []uint64
	streamscan.CountedFrom = func(seq uint64) { starts = append(starts, seq) }
	defer func() { streamscan.CountedFrom = nil }()
	var got []uint64
	r := Range{Tail: 3, Filters: []string{"nexus.events.*.*.s1", "nexus.events.*.*.s2"}}
	if err := j.Scan(context.Background(), r, func(r Record) error {
		got = append(got, r.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []uint64{297, 299, 300}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if len(starts) == 0 {
		t.Fatal("the tail was found without a count")
	}
	for _, s := range starts {
		if s < 300-4*4*3 {
			t.Errorf("a count started at %d of 300 to find a tail of 3 (all: %v)", s, starts)
		}
	}
}
