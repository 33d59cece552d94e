package core

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestPrunePlan runs testdata/prune.txt: each case is the cache entries on
// disk, what the journal knows of their users and open sagas, and the
// limits of an unused-prune, and the plan expected.
//
//	prune [entries=<id>/<bytes>/<unused for>,...] [users=<sandbox>:<cache id>[:overlay],...]
//	      [pending=<kind>:<saga>:<sandbox>,...] [older-than=<duration>] [max-bytes=<n>]
//
// A user with no cache id records no bootstrap; one marked overlay boots
// on its entry. Without max-bytes there is
// no size target. The output is the entries removed, in order, then each
// kept entry and why; or the refusal.
func TestPrunePlan(t *testing.T) {
	const now = int64(1_000_000_000_000)
	var outs []string
	runCases(t, "testdata/prune.txt", func(t *testing.T, c testCase) string {
		if c.cmd != "prune" {
			t.Fatalf("%s: unknown command %q", c.pos, c.cmd)
		}
		c.only(t, "entries", "users", "pending", "older-than", "max-bytes")
		var entries []CachedImage
		for _, e := range list(c, "entries") {
			f := strings.Split(e, "/")
			if len(f) != 3 {
				t.Fatalf("%s: entry %q is not <id>/<bytes>/<unused for>", c.pos, e)
			}
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", c.pos, err)
			}
			ago, err := time.ParseDuration(f[2])
			if err != nil {
				t.Fatalf("%s: %v", c.pos, err)
			}
			entries = append(entries, CachedImage{CacheID: f[0], Allocated: n, UsedMs: now - ago.Milliseconds()})
		}
		var st projections.ImageCacheState
		for _, u := range list(c, "users") {
			sb, id, ok := strings.Cut(u, ":")
			if !ok {
				t.Fatalf("%s: user %q is not <sandbox>:<cache id>[:overlay]", c.pos, u)
			}
			id, root, _ := strings.Cut(id, ":")
			st.Users = append(st.Users, projections.CacheUser{Sandbox: sb, Bootstrap: events.Bootstrap{CacheID: id}, Root: root})
		}
		for _, p := range list(c, "pending") {
			f := strings.Split(p, ":")
			if len(f) != 3 {
				t.Fatalf("%s: pending %q is not <kind>:<saga>:<sandbox>", c.pos, p)
			}
			st.Pending = append(st.Pending, projections.PendingSaga{Kind: events.SagaKind(f[0]), Saga: f[1], Sandbox: f[2]})
		}
		limits := PruneLimits{MaxBytes: -1}
		if v, ok := c.arg("older-than"); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("%s: %v", c.pos, err)
			}
			limits.OlderThan = d
		}
		if v, ok := c.arg("max-bytes"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", c.pos, err)
			}
			limits.MaxBytes = n
		}
		remove, kept, err := PrunePlan(entries, st, limits, now)
		if err != nil {
			if !errors.Is(err, ErrIncomplete) || remove != nil || kept != nil {
				t.Fatalf("%s: refused with %v (not ErrIncomplete), or with a plan: %v %v", c.pos, err, remove, kept)
			}
			out := fmt.Sprintf("refuse %q", err)
			outs = append(outs, out)
			return out
		}
		if len(remove)+len(kept) != len(entries) {
			t.Fatalf("%s: %d removed + %d kept != %d entries", c.pos, len(remove), len(kept), len(entries))
		}
		out := "remove " + strings.Join(remove, " ")
		if len(remove) == 0 {
			out = "remove nothing"
		}
		for _, k := range kept {
			out += fmt.Sprintf("\nkeep %s %q", k.CacheID, k.Reason)
		}
		outs = append(outs, out)
		return out
	})
	// The file covers the refusal and every reason an entry is kept.
	for _, want := range []string{"refuse ", "remove ", "records no bootstrap identity", "referenced by", "used within", "cache fits in"} {
		if !strings.Contains(strings.Join(outs, "\n"), want) {
			t.Errorf("testdata/prune.txt has no case whose plan says %q", want)
		}
	}
}

// list is the comma-separated values of key (none if the case has none).
func list(c testCase, key string) []string {
	v, ok := c.arg(key)
	if !ok || v == "" {
		return nil
	}
	return strings.Split(v, ",")
}
