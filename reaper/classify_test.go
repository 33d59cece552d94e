package reaper

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
)

const (
	idA = "01HZZZZZZZZZZZZZZZZZZZZZZA" // a sandbox the journal knows
	idB = "01HZZZZZZZZZZZZZZZZZZZZZZB" // gone
	idC = "01HZZZZZZZZZZZZZZZZZZZZZZC" // gone, fork child
)

// fakeGate is the liveness gate's evidence as a table, counting the
// questions asked so a test can show the gate runs once per ULID.
type fakeGate struct {
	procs    map[string]Probe
	sockets  map[string]Probe
	sups     map[string]Probe
	intents  map[string]Lease
	asked    map[string]int
	procPids map[string][]int
	runs     map[string]Probe
}

func newGate() *fakeGate {
	return &fakeGate{procs: map[string]Probe{}, sockets: map[string]Probe{}, sups: map[string]Probe{}, intents: map[string]Lease{}, asked: map[string]int{}, procPids: map[string][]int{}, runs: map[string]Probe{}}
}

func (g *fakeGate) Process(id string, ignore []int) Probe {
	g.asked["proc "+id]++
	if pids, ok := g.procPids[id]; ok {
		for _, p := range pids {
			found := false
			for _, i := range ignore {
				found = found || i == p
			}
			if !found {
				return Probe{State: Alive, Detail: "pid names it"}
			}
		}
		return Probe{State: Dead}
	}
	return g.procs[id]
}
func (g *fakeGate) Socket(id string) Probe           { g.asked["sock "+id]++; return g.sockets[id] }
func (g *fakeGate) SupervisorSocket(id string) Probe { return g.sups[id] }
func (g *fakeGate) Intent(rel string) Lease          { g.asked["intent "+rel]++; return g.intents[rel] }
func (g *fakeGate) RunRecord(run string) Probe       { g.asked["run "+run]++; return g.runs[run] }

func journal() Journal {
	return foldOf([]projections.Sandbox{{
		ID: idA, Handle: "team/web",
		Resources: []events.Resource{
			{Kind: events.KindRawDisk, Path: "disks/" + idA + ".raw"},
			{Kind: events.KindSnapshot, Path: "snapshots/" + idA + "/SNAP1"},
			// A name no pattern parses, attributed by the journal.
			{Kind: events.KindRawDisk, Path: "disks/imported-by-hand.img"},
		},
	}}, []projections.OpenSaga{{ID: "S1", Kind: "recover", Sandbox: "01HZZZZZZZZZZZZZZZZZZZZZZD"}})
}

func entry(dir, name string) Entry { return Identify(dir, name, false) }

func one(t *testing.T, in Inputs, e Entry) Decision {
	t.Helper()
	in.Entries = []Entry{e}
	if in.Gate == nil {
		in.Gate = newGate()
	}
	if in.Journal == nil {
		in.Journal = journal()
	}
	return classifyAll(in)[0]
}

func want(t *testing.T, d Decision, v Verdict, owner, mention string) {
	t.Helper()
	if d.Verdict != v || d.Owner != owner || !strings.Contains(d.Reason, mention) {
		t.Fatalf("%s: got %s owner=%q %q; want %s owner=%q mentioning %q", d.Entry.Rel, d.Verdict, d.Owner, d.Reason, v, owner, mention)
	}
}

// A watchdog log is its run's while the run has its record in runs/ (the
// sweep removes it with the run), an orphan once the record is gone, and
// kept when the record cannot be checked; never judged by the journal's
// sandboxes or the ULID gate.
func TestWatchdogLogFollowsItsRun(t *testing.T) {
	for _, c := range []struct {
		record  Probe
		v       Verdict
		mention string
	}{
		{Probe{State: Alive}, Live, "in the ledger"},
		{Probe{State: Dead}, Orphan, "no record in runs/"},
		{Probe{State: Unsure, Detail: "permission denied"}, Ambiguous, "permission denied"},
	} {
		g := newGate()
		g.runs["r1"] = c.record
		want(t, one(t, Inputs{Gate: g}, entry("logs", "run-r1.watchdog.log")), c.v, "", c.mention)
		if g.asked["run r1"] != 1 || len(g.asked) != 1 {
			t.Errorf("gate asked %v: want the run's record alone", g.asked)
		}
	}
	g := newGate()
	g.runs["r1"] = Probe{State: Dead}
	want(t, one(t, Inputs{Gate: g}, entry("logs", "run-a.b.watchdog.log")), Ambiguous, "", "does not parse")
	want(t, one(t, Inputs{Gate: g, Unreadable: "torn"}, entry("logs", "run-r1.watchdog.log")), Ambiguous, "", "torn")
}

// Owner from the journal first, even for a name that does not parse.
func TestOwnerFromJournalFirst(t *testing.T) {
	want(t, one(t, Inputs{}, entry("disks", "imported-by-hand.img")), Owned, idA, "journal attributes")
	want(t, one(t, Inputs{}, entry("disks", idA+".raw")), Owned, idA, "journal attributes")
	// A directory holding a journaled path is owned by that path's sandbox.
	want(t, one(t, Inputs{}, Identify("snapshots", idA, true)), Owned, idA, "journal")
	// Not journaled, but the name's ULID is a known sandbox.
	want(t, one(t, Inputs{}, entry("disks", idA+"-workspace.ext4")), Owned, idA, "owner from the name")
	// Its VMM's sockets are its own only while the journal records them,
	// as replay diff judges them: one left by a start cut short is judged
	// by liveness.
	for _, name := range []string{"sb-" + idA + ".sock", "sb-" + idA + ".iid", "sb-" + idA + ".vsock"} {
		want(t, one(t, Inputs{}, entry("run", name)), Orphan, idA, "API socket dead")
		g := newGate()
		g.procs[idA] = Probe{State: Alive, Detail: "pid 7 names " + idA}
		want(t, one(t, Inputs{Gate: g}, entry("run", name)), Live, idA, "pid 7")
	}
	want(t, one(t, Inputs{}, entry("disks", "team_web.shadow.cfg.ext4")), Owned, idA, "handle team_web")
	// An unparsed, unjournaled name is kept (RL-3).
	want(t, one(t, Inputs{}, entry("disks", "notes.txt")), Ambiguous, "", "does not parse")
}

// RL-14: a fork child's shadow copy belongs to the child.
func TestForkChildShadowCopy(t *testing.T) {
	j := foldOf([]projections.Sandbox{{ID: idC, Parent: idA}}, nil)
	want(t, one(t, Inputs{Journal: j}, entry("disks", idC+"-team_web.shadow.cfg.ext4")), Owned, idC, "exists")
	// Child gone: reclaimable like anything else, through the ULID gate.
	g := newGate()
	want(t, one(t, Inputs{Gate: g}, entry("disks", idC+"-team_web.shadow.cfg.ext4")), Orphan, idC, "API socket dead")
	if g.asked["proc "+idC] != 1 {
		t.Fatal("the fork child's ULID did not go through the liveness gate")
	}
}

func TestLegacyAndHandleShadowDisks(t *testing.T) {
	want(t, one(t, Inputs{}, entry("disks", "old.shadow.ext4")), Orphan, "", "legacy")
	g := newGate()
	want(t, one(t, Inputs{Gate: g}, entry("disks", "gone_h.shadow.cfg.ext4")), Orphan, "gone_h", "no sandbox has handle")
	if g.asked["proc gone_h"] != 0 {
		t.Fatal("a handle-keyed disk was sent through the ULID gate")
	}
}

// Issue 15, item 5: idA's handle is "team/web" (safe "team_web"). The
// leftover disk of a gone "team_web" (safe "team+web") is its own orphan,
// never credited to team/web, and team/web's disk is never an orphan.
func TestSlashAndUnderscoreHandlesAreTold(t *testing.T) {
	want(t, one(t, Inputs{}, entry("disks", "team_web.shadow.cfg.ext4")), Owned, idA, "handle team_web")
	want(t, one(t, Inputs{Gate: newGate()}, entry("disks", "team+web.shadow.cfg.ext4")), Orphan, "team+web", "no sandbox has handle")
}

// RL-7 / RL-17: held leases keep; an unreadable intent keeps, and says so.
func TestLeases(t *testing.T) {
	held := map[string]Lease{layout.CreateIntentRel(idB): {State: LeaseHeld, Covers: []string{"disks/custom-" + idB + ".img"}}}
	want(t, one(t, Inputs{Leases: held}, entry("disks", idB+".raw")), Live, idB, "create intent lease is held")
	want(t, one(t, Inputs{Leases: held}, entry("disks", idB+".create-intent.json")), Live, idB, "lease is held")
	want(t, one(t, Inputs{Leases: held}, entry("supervisors", idB)), Live, idB, "create intent lease is held")
	// A covered path with no parseable name is still protected.
	d := one(t, Inputs{Leases: held}, entry("disks", "custom-"+idB+".img"))
	want(t, d, Live, "", "covered by")

	shadow := map[string]Lease{layout.ShadowIntentRel("new_h"): {State: LeaseHeld}}
	want(t, one(t, Inputs{Leases: shadow}, entry("disks", "new_h.shadow.cfg.ext4")), Live, "new_h", "shadow intent lease is held")

	bad := map[string]Lease{layout.CreateIntentRel(idB): {State: LeaseUnreadable, Err: "permission denied"}}
	want(t, one(t, Inputs{Leases: bad}, entry("disks", idB+".raw")), Ambiguous, idB, "intent unreadable (permission denied)")

	free := map[string]Lease{layout.CreateIntentRel(idB): {State: LeaseFree}}
	want(t, one(t, Inputs{Leases: free}, entry("disks", idB+".create-intent.json")), Orphan, idB, "API socket dead")
	want(t, one(t, Inputs{Leases: free}, entry("disks", idB+".raw")), Orphan, idB, "API socket dead")
}

// The readdir residual: an intent the scan did not list but that exists
// at classification time keeps the resource.
func TestIntentAppearingAfterTheScanKeeps(t *testing.T) {
	g := newGate()
	g.intents[layout.CreateIntentRel(idB)] = Lease{State: LeaseFree}
	want(t, one(t, Inputs{Gate: g}, entry("disks", idB+".raw")), Live, idB, "appeared after the scan")
	g.intents[layout.ShadowIntentRel("late_h")] = Lease{State: LeaseHeld}
	want(t, one(t, Inputs{Gate: g}, entry("disks", "late_h.shadow.cfg.ext4")), Live, "late_h", "appeared after the scan")
}

// RL-8: the gate, asked once per ULID; RL-9: inconclusive keeps.
func TestLivenessGate(t *testing.T) {
	g := newGate()
	g.procs[idB] = Probe{State: Alive, Detail: "pid 7 names " + idB}
	entries := []Entry{entry("disks", idB+".raw"), entry("disks", idB+"-workspace.ext4"), entry("run", "sb-"+idB+".sock")}
	for _, d := range classifyAll(Inputs{Entries: entries, Journal: journal(), Gate: g}) {
		want(t, d, Live, idB, "pid 7")
	}
	if g.asked["proc "+idB] != 1 || g.asked["sock "+idB] != 0 {
		t.Fatalf("gate asked %v: want /proc once, no socket probe after a live process", g.asked)
	}
	cases := []struct {
		proc, sock Probe
		v          Verdict
		mention    string
	}{
		{Probe{State: Unsure, Detail: "pid 9: command line longer than 524288 bytes"}, Probe{}, Ambiguous, "/proc scan inconclusive"},
		{Probe{}, Probe{State: Alive, Detail: "accepts"}, Live, "API socket answers"},
		{Probe{}, Probe{State: Unsure, Detail: "i/o timeout"}, Ambiguous, "API socket probe inconclusive"},
		{Probe{}, Probe{}, Orphan, "API socket dead"},
	}
	for _, c := range cases {
		g := newGate()
		g.procs[idB], g.sockets[idB] = c.proc, c.sock
		want(t, one(t, Inputs{Gate: g}, entry("disks", idB+".raw")), c.v, idB, c.mention)
	}
}

// RL-18: a responsive supervisor socket inside the directory keeps it.
func TestSupervisorStateSocket(t *testing.T) {
	g := newGate()
	g.sups[idB] = Probe{State: Alive, Detail: "supervisor.sock accepts"}
	want(t, one(t, Inputs{Gate: g}, Identify("supervisors", idB, true)), Live, idB, "supervisor socket answers")
	g.sups[idB] = Probe{State: Unsure, Detail: "timeout"}
	want(t, one(t, Inputs{Gate: g}, Identify("supervisors", idB, true)), Ambiguous, idB, "inconclusive")
	g.sups[idB] = Probe{}
	want(t, one(t, Inputs{Gate: g}, Identify("supervisors", idB, true)), Orphan, idB, "dead")
}

func TestAmbiguityKeeps(t *testing.T) {
	e := entry("disks", idB+".raw")
	e.StatErr = "permission denied"
	want(t, one(t, Inputs{}, e), Ambiguous, idB, "stat failed")
	ln := entry("disks", idB+".raw")
	ln.Symlink = true
	want(t, one(t, Inputs{}, ln), Ambiguous, idB, "symbolic link")
	// A journal that cannot be fully read keeps everything, even the legacy kind.
	for _, e := range []Entry{entry("disks", "old.shadow.ext4"), entry("disks", idB+".raw")} {
		d := one(t, Inputs{Unreadable: "event 7: schema 9 is newer than supported 1"}, e)
		if d.Verdict != Ambiguous || !strings.Contains(d.Reason, "schema 9") {
			t.Fatalf("unreadable journal: %+v", d)
		}
	}
	// An open saga of an unknown sandbox: recover's to finish.
	want(t, one(t, Inputs{}, entry("disks", "01HZZZZZZZZZZZZZZZZZZZZZZD.raw")), Live, "01HZZZZZZZZZZZZZZZZZZZZZZD", "saga")
}

// RL-13: a recorded supervisor of a gone sandbox is an orphan, and its
// own command line is then no evidence that the sandbox lives.
func TestOrphanSupervisorProcess(t *testing.T) {
	g := newGate()
	g.procPids[idB] = []int{4242}
	sup := Entry{Name: layout.Name{Kind: events.KindSupervisorProcess, ID: idB}, Rel: "/proc/4242", Pid: 4242, StartTicks: 99}
	ds := classifyAll(Inputs{Entries: []Entry{Identify("supervisors", idB, true), sup}, Journal: journal(), Gate: g})
	want(t, ds[1], Orphan, idB, "pid and start time still match")
	want(t, ds[0], Orphan, idB, "dead")
	// Another process naming the ULID still keeps the state.
	g.procPids[idB] = []int{4242, 5000}
	ds = classifyAll(Inputs{Entries: []Entry{Identify("supervisors", idB, true), sup}, Journal: journal(), Gate: g})
	want(t, ds[0], Live, idB, "pid names it")
	// A supervisor of a sandbox that still exists is recover's business.
	want(t, one(t, Inputs{}, Entry{Name: layout.Name{Kind: events.KindSupervisorProcess, ID: idA}, Rel: "/proc/1", Pid: 1}), Owned, idA, "exists")
}

func TestSupervisorHistory(t *testing.T) {
	s := NewSupervisors()
	ev := func(sb string, p events.Payload) events.Event { return events.New([16]byte{1}, time.Unix(0, 0), sb, p) }
	s.Apply(ev(idA, events.SupervisorStartedEvent{Pid: 10, Start: 1}))
	s.Apply(ev(idB, events.SupervisorStartedEvent{Pid: 20, Start: 2}))
	s.Apply(ev(idB, events.SupervisorStartedEvent{Pid: 21, Start: 3}))
	s.Apply(ev(idB, events.SupervisorStoppedEvent{Pid: 20}))
	gone := s.Gone(journal())
	if len(gone) != 1 || gone[0].Sandbox != idB || gone[0].Pid != 21 || gone[0].StartTicks != 3 {
		t.Fatalf("gone supervisors: %+v", gone)
	}
}

func TestFilterAndOrder(t *testing.T) {
	now := time.Unix(10_000, 0)
	old := Decision{Entry: Entry{Name: layout.Name{Kind: events.KindRawDisk, ID: idB}, ModTime: now.Add(-2 * time.Hour)}, Owner: idB}
	young := Decision{Entry: Entry{Name: layout.Name{Kind: events.KindRawDisk, ID: idB}, ModTime: now.Add(-time.Minute)}, Owner: idB}
	f := Filter{OlderThan: 3600, NowUnix: now.Unix()}
	if !f.Match(old) || f.Match(young) {
		t.Fatal("--older-than")
	}
	if (Filter{Kind: events.KindSnapshot}).Match(old) || !(Filter{Kind: events.KindRawDisk}).Match(old) {
		t.Fatal("--kind")
	}
	if (Filter{Sandbox: idA}).Match(old) || !(Filter{Sandbox: idB}).Match(old) {
		t.Fatal("--sandbox")
	}
	shadow := Decision{Entry: Identify("disks", "team_web.shadow.cfg.ext4", false), Owner: "team_web"}
	if !(Filter{Handle: "team_web"}).Match(shadow) || (Filter{Handle: "team_web"}).Match(old) || (Filter{Sandbox: idB}).Match(shadow) {
		t.Fatal("--sandbox HANDLE")
	}
	ds := []Decision{{Entry: Entry{Name: layout.Name{Kind: events.KindCreateIntent}, Rel: "a"}}, {Entry: Entry{Name: layout.Name{Kind: events.KindRawDisk}, Rel: "b"}}, {Entry: Entry{Name: layout.Name{Kind: events.KindSupervisorProcess}, Rel: "c"}}}
	Order(ds)
	if ds[0].Entry.Kind != events.KindSupervisorProcess || ds[2].Entry.Kind != events.KindCreateIntent {
		t.Fatalf("apply order: %v", ds)
	}
}

// Order sorts by kind's rank, then path, keeping equal keys in the order
// given, and moves the decisions in place: the one allocation it makes is
// its index, never a second copy of every decision (a root's scan holds
// one per entry).
func TestOrderInPlace(t *testing.T) {
	kinds := []events.ResourceKind{events.KindRawDisk, events.KindCreateIntent, events.KindSupervisorProcess, events.KindSnapshot}
	var ds []Decision
	for i := range 500 {
		// Few paths, so that many decisions share a key.
		ds = append(ds, Decision{Entry: Entry{Name: layout.Name{Kind: kinds[(i*7)%len(kinds)]}, Rel: "p" + strconv.Itoa((i*31)%23)}, Reason: strconv.Itoa(i)})
	}
	rank := map[events.ResourceKind]int{events.KindSupervisorProcess: 0, events.KindRawDisk: 1, events.KindSnapshot: 1, events.KindCreateIntent: 2}
	want := slices.Clone(ds)
	slices.SortStableFunc(want, func(a, b Decision) int {
		if c := cmp.Compare(rank[a.Entry.Kind], rank[b.Entry.Kind]); c != 0 {
			return c
		}
		return strings.Compare(a.Entry.Rel, b.Entry.Rel)
	})
	got := slices.Clone(ds)
	Order(got)
	for i := range want {
		if got[i].Reason != want[i].Reason {
			t.Fatalf("decision %d: %s %s (given %s), want %s %s (given %s)", i, got[i].Entry.Kind, got[i].Entry.Rel, got[i].Reason, want[i].Entry.Kind, want[i].Entry.Rel, want[i].Reason)
		}
	}
	buf := slices.Clone(ds)
	if n := testing.AllocsPerRun(5, func() { copy(buf, ds); Order(buf) }); n != 1 {
		t.Fatalf("Order of %d decisions made %v allocations, want 1 (its index)", len(ds), n)
	}
}

// classifyAll is every entry's decision, in the entries' order.
func classifyAll(in Inputs) []Decision {
	out := make([]Decision, len(in.Entries))
	ClassifyEach(in, func(i int, d Decision) { out[i] = d })
	return out
}
