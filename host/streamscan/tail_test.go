package streamscan

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/internal/jstest"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A tail is looked for near the end before the whole range is counted:
// matching the filters against every subject of a large journal costs a
// step per subject, a count from near the end only the last blocks. The
// whole range is counted once when the tail is not near the end, and a
// tail longer than what matches yields all of it.
func TestTailCountsTheWholeRangeOnlyWhenFarBack(t *testing.T) {
	defer func(n uint64) { nearEnd = n }(nearEnd)
	nearEnd = 64
	js := jstest.Connect(t, jstest.Start(t, server.Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TAIL", Subjects: []string{"nexus.events.>"}})
	if err != nil {
		t.Fatal(err)
	}
	// 1,000 records on s0..s2 in turn; the 5th, 7th and 9th are on a
	// subject seen nowhere else.
	var subjects []string
	for i := range 1000 {
		subject := fmt.Sprintf("nexus.events.sandbox.created.s%d", i%3)
		if i == 4 || i == 6 || i == 8 {
			subject = "nexus.events.sandbox.removed.rare"
		}
		subjects = append(subjects, subject)
		if _, err := js.Publish(ctx, subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		filters []string
		tail    int
		whole   bool // counted from the range's start
	}{
		{[]string{"nexus.events.*.*.s1", "nexus.events.*.*.s2"}, 3, false},
		{[]string{"nexus.events.sandbox.created.*"}, 40, false},
		{[]string{"nexus.events.sandbox.removed.*"}, 2, true},
		{[]string{"nexus.events.sandbox.removed.*"}, 5, true},
	} {
		var want []uint64
		for i, s := range subjects {
			for _, f := range c.filters {
				if matches(f, s) {
					want = append(want, uint64(i+1))
				}
			}
		}
		want = want[max(0, len(want)-c.tail):]
		var starts, got []uint64
		CountedFrom = func(seq uint64) { starts = append(starts, seq) }
		err := Scan(ctx, stream, Range{Filters: c.filters, Tail: c.tail}, func(r Record) error {
			got = append(got, r.Seq)
			return nil
		})
		CountedFrom = nil
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("tail %d of %v: got %v, want %v", c.tail, c.filters, got, want)
		}
		if whole := slices.Contains(starts, 1); whole != c.whole {
			t.Errorf("tail %d of %v: counts started at %v; counted from the start: %v, want %v", c.tail, c.filters, starts, whole, c.whole)
		}
		// The gallop goes back at most four times as far as the tail
		// reaches.
		for _, s := range starts {
			if !c.whole && s+4*(1000-want[0]+1) < 1000 {
				t.Errorf("tail %d of %v: a count started at %d of 1000 (all: %v)", c.tail, c.filters, s, starts)
			}
		}
	}
}

// matches is whether subject matches the filter f ("*" one token).
func matches(f, subject string) bool {
	ft, st := strings.Split(f, "."), strings.Split(subject, ".")
	if len(ft) != len(st) {
		return false
	}
	for i := range ft {
		if ft[i] != "*" && ft[i] != st[i] {
			return false
		}
	}
	return true
}
