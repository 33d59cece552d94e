package projections

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

// scanOwner and scanHandle are OwnerOf and ByHandle as full scans (how
// they were before the indexes): the indexes must answer the same.
func scanOwner(s *Sandboxes, paths []string, except string) (string, string, bool) {
	for _, sb := range s.List() {
		if sb.ID == except {
			continue
		}
		for _, p := range paths {
			if sb.Owns(p) {
				return sb.ID, p, true
			}
		}
	}
	return "", "", false
}

func scanSnapshot(s *Sandboxes, snap string) *Sandbox {
	for _, sb := range s.List() {
		if slices.Contains(sb.Snapshots, snap) {
			return sb
		}
	}
	return nil
}

func scanHandle(s *Sandboxes, h string) *Sandbox {
	for _, sb := range s.List() {
		if sb.Handle == h {
			return sb
		}
	}
	return nil
}

// Random histories of creates, claims, releases, snapshots taken and
// removed, removals and compensated creates over a few sandboxes sharing a
// few paths: after every event, and after a snapshot round trip, OwnerOf,
// ByHandle and SnapshotOwner through the indexes equal the scans for every
// path pair, handle and snapshot.
func TestSandboxIndexesMatchScans(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewSource(seed))
		ids := make([]string, 6)
		for i := range ids {
			ids[i] = ulid.MustNew(uint64(i+1), rng).String()
		}
		paths := []string{"disks/a", "disks/b", "disks/c", "run/d", "snapshots/x/e"}
		snaps := []string{"S1", "S2", "S3"}
		res := func() events.Resource {
			return events.Resource{Kind: events.KindRawDisk, Path: paths[rng.Intn(len(paths))]}
		}
		s := NewSandboxes()
		for step := 0; step < 300; step++ {
			id := ids[rng.Intn(len(ids))]
			var p events.Payload
			saga := ""
			switch rng.Intn(11) {
			case 0:
				p = events.SandboxCreatedEvent{Handle: fmt.Sprintf("h%d", rng.Intn(4)), Resources: []events.Resource{res(), res()}}
			case 1:
				p, saga = events.SagaStartedEvent{Kind: events.SagaCreate}, "S"+id
			case 2:
				p, saga = events.SagaCompensatedEvent{Reason: "t"}, "S"+id
			case 3:
				p = events.DiskMaterialisedEvent{Resource: res()}
			case 4:
				p = events.ResourceReclaimedEvent{Resource: res()}
			case 5:
				p = events.IntentRetiredEvent{Resource: res()}
			case 6:
				p = events.SandboxRemovedEvent{}
			case 8:
				snap := snaps[rng.Intn(len(snaps))]
				p = events.SnapshotTakenEvent{SnapshotID: snap, Dir: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + id + "/" + snap}}
			case 9:
				p = events.ResourceReclaimedEvent{Resource: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + id + "/" + snaps[rng.Intn(len(snaps))]}}
			case 7:
				p = events.SandboxForkedEvent{Handle: fmt.Sprintf("h%d", rng.Intn(4)), Resources: []events.Resource{res()}}
			default:
				p = events.SupervisorStartedEvent{Pid: 1, StateDir: res()}
			}
			e := events.New(ulid.Make(), time.Unix(int64(step), 0), id, p)
			e.Saga = saga
			s.Apply(uint64(step+1), e)
			check := func(v *Sandboxes, when string) {
				t.Helper()
				for _, a := range paths {
					for _, b := range paths {
						for _, except := range []string{"", ids[0], ids[3]} {
							gi, gp, gf := v.OwnerOf([]string{a, b}, except)
							wi, wp, wf := scanOwner(v, []string{a, b}, except)
							if gi != wi || gp != wp || gf != wf {
								t.Fatalf("seed %d step %d %s: OwnerOf(%s,%s except %s) = %s %s %v, scan %s %s %v", seed, step, when, a, b, except, gi, gp, gf, wi, wp, wf)
							}
						}
					}
				}
				for h := range 4 {
					handle := fmt.Sprintf("h%d", h)
					got, want := v.ByHandle(handle), scanHandle(v, handle)
					// Two sandboxes may carry one handle in a random
					// history (create refuses it for real); then either is
					// a scan's answer, and the index must give one of them.
					if (got == nil) != (want == nil) || got != nil && got.Handle != handle {
						t.Fatalf("seed %d step %d %s: ByHandle(%s) = %v, scan %v", seed, step, when, handle, got, want)
					}
				}
				for _, snap := range snaps {
					got, want := v.SnapshotOwner(snap), scanSnapshot(v, snap)
					// As with handles, a random history may give two
					// sandboxes one snapshot ID; the index gives one of them.
					if (got == nil) != (want == nil) || got != nil && !slices.Contains(got.Snapshots, snap) {
						t.Fatalf("seed %d step %d %s: SnapshotOwner(%s) = %v, scan %v", seed, step, when, snap, got, want)
					}
				}
				if v.ByHandle("") != nil {
					t.Fatalf("ByHandle(\"\") found a sandbox")
				}
			}
			check(s, "live")
			if step%50 == 49 {
				data, err := s.MarshalState()
				if err != nil {
					t.Fatal(err)
				}
				back := NewSandboxes()
				if err := back.UnmarshalState(s.Seq(), data); err != nil {
					t.Fatal(err)
				}
				check(back, "decoded")
			}
		}
	}
}
