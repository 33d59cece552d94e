package projections

import (
	"reflect"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

// TestImageCacheReferences: a stopped sandbox still references its entry,
// only sandbox.removed ends the reference, a sandbox without bootstrap is
// unattributed, and an open create saga is pending until it closes.
func TestImageCacheReferences(t *testing.T) {
	c, sandboxes := NewImageCache(), NewSandboxes()
	seq := uint64(0)
	apply := func(sb, saga string, p events.Payload) {
		seq++
		e := events.New(ulid.Make(), t0.Add(time.Duration(seq)*time.Second), sb, p)
		e.Saga = saga
		c.Apply(seq, e)
		sandboxes.Apply(seq, e)
	}
	state := func(c *ImageCache) ImageCacheState { return c.State(CacheUsers(sandboxes.List())) }
	a, b, legacy := ulid.Make().String(), ulid.Make().String(), ulid.Make().String()
	boot := events.Bootstrap{CacheID: "img-a", Identity: "stat-sha256:aa"}

	apply(a, "s1", events.SagaStartedEvent{Kind: "create"})
	apply(a, "s1", events.ImageCachePreparedEvent{CacheID: "img-a", Ref: "/x.raw", Identity: boot.Identity, Layout: 1, Path: "images/img-a"})
	apply(a, "s1", events.ImageCacheUsedEvent{CacheID: "img-a", LastUseMs: 10})
	if st := state(c); len(st.Pending) != 1 || st.Pending[0].Sandbox != a {
		t.Fatalf("open create not pending: %+v", st.Pending)
	}
	apply(a, "s1", events.SandboxCreatedEvent{Image: "/x.raw", Bootstrap: boot})
	apply(a, "s1", events.SandboxStoppedEvent{})
	apply(a, "s1", events.SagaFinishedEvent{})
	apply(b, "", events.SandboxForkedEvent{Parent: a, Bootstrap: boot})
	apply(legacy, "", events.SandboxCreatedEvent{Image: "/old.raw"})
	apply("", "", events.ImageCacheUsedEvent{CacheID: "img-a", LastUseMs: 5}) // older: ignored
	apply("", "", events.ImageCacheUsedEvent{CacheID: "ghost", LastUseMs: 5}) // unknown entry: ignored

	st := state(c)
	if len(st.Pending) != 0 {
		t.Fatalf("finished saga still pending: %+v", st.Pending)
	}
	if want := []CacheEntry{{CacheID: "img-a", Ref: "/x.raw", Identity: boot.Identity, Layout: 1, Path: "images/img-a", LastUseMs: 10}}; !reflect.DeepEqual(st.Entries, want) {
		t.Fatalf("entries = %+v, want %+v", st.Entries, want)
	}
	refs, unattributed := st.References()
	if got := refs["img-a"]; len(got) != 2 {
		t.Fatalf("img-a referenced by %v, want the stopped sandbox and its fork", got)
	}
	if !reflect.DeepEqual(unattributed, []string{legacy}) {
		t.Fatalf("unattributed = %v, want [%s]", unattributed, legacy)
	}

	// A snapshot round-trips to the same state.
	data, err := c.MarshalState()
	if err != nil {
		t.Fatal(err)
	}
	c2 := NewImageCache()
	if err := c2.UnmarshalState(seq, data); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(state(c2), st) || c2.Seq() != seq {
		t.Fatalf("snapshot changed the state:\n%+v\n%+v", state(c2), st)
	}

	apply(a, "", events.SandboxRemovedEvent{})
	apply(b, "", events.SandboxRemovedEvent{})
	if refs, _ := state(c).References(); len(refs["img-a"]) != 0 {
		t.Fatalf("removed sandboxes still reference img-a: %v", refs)
	}
	apply("", "", events.ImageCachePrunedEvent{CacheID: "img-a"})
	if c.Entry("img-a") != nil {
		t.Fatal("pruned entry still known")
	}
	// A compensated create closes its pending saga and references nothing.
	d := ulid.Make().String()
	apply(d, "s2", events.SagaStartedEvent{Kind: "create"})
	apply(d, "s2", events.SagaCompensatedEvent{Reason: "x"})
	if st := state(c); len(st.Pending) != 0 || len(st.Users) != 1 {
		t.Fatalf("after a compensated create: %+v", st)
	}
}
