package replay

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// history is two sandboxes' lives: a is created with a handle and later
// removed, b is created and its create saga never finishes.
func history(t *testing.T) (recs []Record, a, b string, t0 time.Time) {
	t.Helper()
	t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	a, b = ulid.Make().String(), ulid.Make().String()
	raw := events.Resource{Kind: events.KindRawDisk, Path: "disks/" + a + ".raw"}
	evs := []events.Event{
		events.New(ulid.Make(), t0, a, events.SagaStartedEvent{Kind: "create"}).InSaga("s-a", "saga.started"),
		events.New(ulid.Make(), t0.Add(time.Second), a, events.SandboxCreatedEvent{Handle: "dev/a", Image: "img", Driver: "process", Resources: []events.Resource{raw}}).InSaga("s-a", "commit"),
		events.New(ulid.Make(), t0.Add(2*time.Second), a, events.SagaFinishedEvent{}).InSaga("s-a", "saga.finished"),
		events.New(ulid.Make(), t0.Add(3*time.Second), b, events.SagaStartedEvent{Kind: "create"}).InSaga("s-b", "saga.started"),
		events.New(ulid.Make(), t0.Add(4*time.Second), a, events.SandboxRemovedEvent{}),
	}
	for i, e := range evs {
		recs = append(recs, rec(t, uint64(i+1), e))
	}
	return recs, a, b, t0
}

func TestTimelineOfARemovedSandboxByHandle(t *testing.T) {
	recs, a, _, _ := history(t)
	id, err := Resolve(recs, "dev/a")
	if err != nil || id != a {
		t.Fatalf("Resolve(dev/a) = %q, %v; want %s", id, err, a)
	}
	tl, err := Timeline(recs, id)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, e := range tl {
		seqs = append(seqs, e.Seq)
	}
	if len(seqs) != 4 || seqs[0] != 1 || seqs[3] != 5 || tl[1].Step != "commit" || tl[1].Saga != "s-a" {
		t.Fatalf("timeline: %+v", tl)
	}
	if _, err := Resolve(recs, "nobody"); err == nil {
		t.Fatal("an unknown handle resolved")
	}
	// A removed sandbox answers to a unique prefix of its ID too; a
	// prefix shared with b names both.
	if id, err := Resolve(recs, strings.ToLower(a[:25])); err != nil || id != a {
		t.Fatalf("Resolve(prefix of a) = %q, %v; want %s", id, err, a)
	}
	var amb *projections.AmbiguousError
	if _, err := Resolve(recs, a[:4]); !errors.As(err, &amb) || len(amb.Candidates) != 2 {
		t.Fatalf("Resolve(%s) = %v; want ambiguous between a and b", a[:4], err)
	}
	if gotID, both, err := TimelineOf(recs, "dev/a"); err != nil || gotID != a || len(both) != len(tl) {
		t.Fatalf("TimelineOf(dev/a) = %q, %d entries, %v; want %s and %d", gotID, len(both), err, a, len(tl))
	}
}

func TestAtSequenceAndTime(t *testing.T) {
	recs, a, b, t0 := history(t)
	st, err := At(recs, Point{Seq: 4})
	if err != nil {
		t.Fatal(err)
	}
	if st.Seq != 4 || len(st.Sandboxes) != 2 || len(st.Ownership) != 1 || st.Ownership[0].Sandbox != a || len(st.OpenSagas) != 1 || st.OpenSagas[0].Sandbox != b {
		t.Fatalf("at 4: %+v", st)
	}
	for _, sb := range st.Sandboxes {
		if want := map[string]string{a: "running", b: "creating"}[sb.ID]; string(sb.State) != want && !(sb.ID == a && sb.State == "stopped") {
			t.Fatalf("at 4, %s is %s", sb.ID, sb.State)
		}
	}
	end, err := At(recs, Point{})
	if err != nil {
		t.Fatal(err)
	}
	if end.Seq != 5 || len(end.Sandboxes) != 1 || end.Sandboxes[0].ID != b || len(end.Ownership) != 0 {
		t.Fatalf("at the end, a was removed: %+v", end)
	}
	byTime, err := At(recs, Point{Time: t0.Add(1500 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if byTime.Seq != 2 || len(byTime.OpenSagas) != 1 || byTime.OpenSagas[0].ID != "s-a" {
		t.Fatalf("at t0+1.5s: %+v", byTime)
	}
}

func TestTimelineRefusesAnUndecodableJournal(t *testing.T) {
	recs, a, _, _ := history(t)
	recs[2].Data = []byte("torn")
	if _, err := Timeline(recs, a); !errors.Is(err, ErrUnreadable) {
		t.Fatalf("Timeline over a damaged record: %v", err)
	}
	if _, err := At(recs, Point{}); !errors.Is(err, ErrUnreadable) {
		t.Fatalf("At over a damaged record: %v", err)
	}
}
