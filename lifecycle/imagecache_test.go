package lifecycle

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

func TestPlanPrune(t *testing.T) {
	const now = int64(1_000_000_000)
	hour := time.Hour.Milliseconds()
	list := []CacheListing{
		{CacheID: "a", Allocated: 100, ageMs: now - 10*hour},
		{CacheID: "b", Allocated: 200, ageMs: now - 1*hour},
		{CacheID: "c", Allocated: 400, ageMs: now - 5*hour},
		{CacheID: "d", Allocated: 800, ageMs: now - 20*hour}, // referenced
	}
	st := projections.ImageCacheState{Users: []projections.CacheUser{{Sandbox: "S1", Bootstrap: events.Bootstrap{CacheID: "d"}}}}
	ids := func(ls []CacheListing) []string {
		var out []string
		for _, l := range ls {
			out = append(out, l.CacheID)
		}
		return out
	}
	for _, c := range []struct {
		name string
		opts CachePruneOptions
		want []string
	}{
		{"all unused, oldest first", CachePruneOptions{MaxBytes: -1}, []string{"a", "c", "b"}},
		{"older than 4h", CachePruneOptions{OlderThan: 4 * time.Hour, MaxBytes: -1}, []string{"a", "c"}},
		// total 1500; evict LRU unreferenced until <= 1000: a (1400), c (1000).
		{"max bytes evicts least recently used", CachePruneOptions{MaxBytes: 1000}, []string{"a", "c"}},
		{"max bytes already met", CachePruneOptions{MaxBytes: 1500}, nil},
		// referenced d alone exceeds 0: every unreferenced entry goes, d stays.
		{"max bytes below the referenced floor", CachePruneOptions{MaxBytes: 0}, []string{"a", "c", "b"}},
		{"older than and max bytes together", CachePruneOptions{OlderThan: 6 * time.Hour, MaxBytes: 0}, []string{"a"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			remove, kept, err := planPrune(list, st, c.opts, now)
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(remove); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("remove %v, want %v", got, c.want)
			}
			if len(remove)+len(kept) != len(list) {
				t.Fatalf("%d removed + %d kept != %d entries", len(remove), len(kept), len(list))
			}
			for _, k := range kept {
				if k.CacheID == "d" && k.Reason != "referenced by S1" {
					t.Fatalf("d kept for %q", k.Reason)
				}
			}
		})
	}

	legacy := st
	legacy.Users = append(legacy.Users, projections.CacheUser{Sandbox: "OLD"})
	if remove, _, err := planPrune(list, legacy, CachePruneOptions{MaxBytes: -1}, now); err != nil || len(remove) != 0 {
		t.Fatalf("a sandbox without bootstrap must protect everything: %v %v", ids(remove), err)
	}
	pending := st
	pending.Pending = []projections.PendingSaga{{Saga: "G", Kind: "create", Sandbox: "S2"}}
	if _, _, err := planPrune(list, pending, CachePruneOptions{MaxBytes: -1}, now); !errors.Is(err, core.ErrIncomplete) {
		t.Fatalf("an open create must block prune, got %v", err)
	}
}
