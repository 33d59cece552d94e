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

// A filtered tail near the end is read, not counted: a filtered count
// makes the server match the filters against every subject of the stream
// (at a large journal, every sandbox's), reading the last few hundred
// records costs what they are. A tail further back, or longer than what
// matches, is located by counts.
func TestTailNearTheEndIsReadNotCounted(t *testing.T) {
	ctx, js, stream := tailStream(t)
	// 1,000 records on s0..s2 in turn; the 5th, 7th and 9th are on a
	// subject seen nowhere else.
	const n = 1000
	var subjects []string
	for i := range n {
		subject := fmt.Sprintf("nexus.events.sandbox.created.s%d", i%3)
		if i == 4 || i == 6 || i == 8 {
			subject = "nexus.events.sandbox.removed.rare"
		}
		subjects = append(subjects, subject)
		if _, err := js.Publish(ctx, subject, []byte(subject)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		filters []string
		tail    int
		from    uint64
		counted bool
	}{
		{[]string{"nexus.events.*.*.s1", "nexus.events.*.*.s2"}, 3, 0, false},
		{[]string{"nexus.events.sandbox.created.*"}, 40, 0, false},
		{[]string{"nexus.events.sandbox.>"}, 1, 0, false},
		// The window is the whole range and holds fewer than the tail.
		{[]string{"nexus.events.sandbox.removed.*"}, 5, n - 10, false},
		{[]string{"nexus.events.sandbox.removed.*"}, 2, 0, true},
		{[]string{"nexus.events.sandbox.removed.*"}, 5, 0, true},
	} {
		var want []uint64
		for i, s := range subjects {
			for _, f := range c.filters {
				if uint64(i+1) >= c.from && matchesTokens(f, s) {
					want = append(want, uint64(i+1))
				}
			}
		}
		want = want[max(0, len(want)-c.tail):]
		var starts, got []uint64
		CountedFrom = func(seq uint64) { starts = append(starts, seq) }
		err := Scan(ctx, stream, Range{From: c.from, Filters: c.filters, Tail: c.tail}, func(r Record) error {
			if string(r.Data) != r.Subject {
				t.Errorf("record %d holds %q, want %q", r.Seq, r.Data, r.Subject)
			}
			got = append(got, r.Seq)
			return nil
		})
		CountedFrom = nil
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("tail %d of %v from %d: got %v, want %v", c.tail, c.filters, c.from, got, want)
		}
		if counted := len(starts) > 0; counted != c.counted {
			t.Errorf("tail %d of %v from %d: counts from %v; counted: %v, want %v", c.tail, c.filters, c.from, starts, counted, c.counted)
		}
	}
}

// A tail the window does not hold is located by counts that start near
// the end: a count from a sequence makes the server load every block from
// there on, so a search that bisected the whole range would load half of
// it on its first count.
func TestTailCountsFromTheEnd(t *testing.T) {
	defer func(w func(int) uint64) { tailWindow = w }(tailWindow)
	tailWindow = func(int) uint64 { return 0 }
	ctx, js, stream := tailStream(t)
	for i := range 300 { // seq i+1 on s<i%3>
		if _, err := js.Publish(ctx, fmt.Sprintf("nexus.events.sandbox.created.s%d", i%3), nil); err != nil {
			t.Fatal(err)
		}
	}
	var starts, got []uint64
	CountedFrom = func(seq uint64) { starts = append(starts, seq) }
	defer func() { CountedFrom = nil }()
	r := Range{Tail: 3, Filters: []string{"nexus.events.*.*.s1", "nexus.events.*.*.s2"}}
	if err := Scan(ctx, stream, r, func(r Record) error {
		got = append(got, r.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []uint64{297, 299, 300}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// The first count is of the whole range, from its start: the server
	// answers it from its per-subject totals, loading no block.
	if len(starts) < 2 || starts[0] != 1 {
		t.Fatalf("counts started at %v: want the range's start first", starts)
	}
	for _, s := range starts[1:] {
		if s < 300-4*4*3 {
			t.Errorf("a count started at %d of 300 to find a tail of 3 (all: %v)", s, starts)
		}
	}
}

// tailStream is a stream of nexus.events.> on a server of the test's own,
// and a context bounding the test.
func tailStream(t *testing.T) (context.Context, jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	js := jstest.Connect(t, jstest.Start(t, server.Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	t.Cleanup(cancel)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TAIL", Subjects: []string{"nexus.events.>"}})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, js, stream
}

// matchesTokens is whether subject matches the filter f, "*" standing for
// one token and ">" for the rest, token by token.
func matchesTokens(f, subject string) bool {
	ft, st := strings.Split(f, "."), strings.Split(subject, ".")
	for i := range ft {
		switch {
		case ft[i] == ">":
			return len(st) > i
		case i >= len(st) || ft[i] != "*" && ft[i] != st[i]:
			return false
		}
	}
	return len(ft) == len(st)
}

func TestMatchSubject(t *testing.T) {
	for _, c := range []struct {
		f, s string
		want bool
	}{
		{"a.b", "a.b", true}, {"a.b", "a.c", false}, {"a.*", "a.b", true}, {"a.*", "a.b.c", false},
		{"a.*", "a", false}, {"a.>", "a", false}, {"a.>", "a.b", true}, {"a.>", "a.b.c", true},
		{">", "a", true}, {"*", "a", true}, {"*", "a.b", false}, {"a.*.c", "a.b.c", true},
		{"a.*.c", "a.b.d", false}, {"a.b.c", "a.b", false}, {"ab", "a", false}, {"a", "ab", false},
	} {
		if got := matchSubject(c.f, c.s); got != c.want || matchesTokens(c.f, c.s) != c.want {
			t.Errorf("matchSubject(%q, %q) = %v (by tokens %v), want %v", c.f, c.s, got, matchesTokens(c.f, c.s), c.want)
		}
	}
}
