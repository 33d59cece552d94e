package reaper

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
)

// Verdict is the reaper's judgement of one resource.
type Verdict string

const (
	Owned     Verdict = "owned"     // the journal (or the name, against the journal) names a sandbox
	Live      Verdict = "live"      // no owner, but a lease, a process or a socket says someone uses it
	Ambiguous Verdict = "ambiguous" // cannot tell: kept, an operator should look
	Orphan    Verdict = "orphan"    // every check is definitively dead: reclaimable
)

// Decision is a verdict on one entry, with the owner it resolved and why.
type Decision struct {
	Entry   Entry
	Owner   string
	Verdict Verdict
	Reason  string
}

// LeaseState is what a non-blocking flock probe of an intent found.
type LeaseState int

const (
	LeaseGone       LeaseState = iota // no such file
	LeaseFree                         // the creator is gone
	LeaseHeld                         // a creator is in flight
	LeaseUnreadable                   // cannot be opened or probed: a creator may be alive
)

// Lease is one probed intent.
type Lease struct {
	State LeaseState
	// Covers are the paths a readable intent says its creator may write.
	Covers []string
	Err    string
}

// Probe is the outcome of one liveness check (a process or a socket).
type Probe struct {
	State  ProbeState
	Detail string
}

type ProbeState int

const (
	Dead ProbeState = iota
	Alive
	Unsure
)

// Gate is the liveness gate's evidence. Its methods are called only
// for ULIDs that have no owner and no lease, each at most once per ULID.
// Implementations hold a single /proc scan taken for the whole run.
type Gate interface {
	// Process says whether a process other than an identified orphan names id.
	Process(id string, ignorePids []int) Probe
	// Socket probes run/sb-<id>.sock.
	Socket(id string) Probe
	// SupervisorSocket probes supervisors/<id>/supervisor.sock.
	SupervisorSocket(id string) Probe
	// Intent probes an intent the scan did not list (it may have landed in
	// a directory slot the readdir had already passed).
	Intent(rel string) Lease
	// RunRecord says whether client run run still has its record in runs/
	// (Alive), has none (Dead), or cannot be told (Unsure). Asked after
	// the scan: a run's record is published before its watchdog log.
	RunRecord(run string) Probe
}

// Journal is the journal's ownership as the reaper asks it: one question
// per entry judged, each answered by point lookups in the store's indexes
// (projections.PathOwner's rule for a path), so a reap costs what it
// scanned, not the sandboxes the root holds. An index that fails to
// answer must answer "owned" or "exists" (ambiguity keeps) and report the
// failure to its caller, who then trusts no verdict of the run.
type Journal interface {
	// Owner is the sandbox the journal gives path rel to.
	Owner(rel string) (id string, ok bool)
	// Sandbox says whether sandbox id exists, committed or in flight.
	Sandbox(id string) bool
	// Handle is the sandbox holding the safe handle h (layout.SafeHandle).
	Handle(h string) (id string, ok bool)
	// OpenSaga is the kind of a saga of sandbox id that is open.
	OpenSaga(id string) (kind string, ok bool)
}

// Inputs are everything one classification looks at.
type Inputs struct {
	Entries []Entry
	// Leases holds every intent the scan listed, probed BEFORE the journal
	// was read, keyed by the intent's relative path. A lease is released
	// only after its create's commit is journaled, so a create that lets go
	// between the two observations is in the journal read afterwards.
	Leases  map[string]Lease
	Journal Journal
	// Unreadable, if set, says why the journal could not be fully read:
	// every entry is then kept.
	Unreadable string
	Gate       Gate
}

// ClassifyEach judges every entry and gives each decision to each with
// its entry's index, as it is made (recorded supervisor processes
// first), so a caller keeps only what it reports. It is pure: all
// evidence comes from in.
func ClassifyEach(in Inputs, each func(int, Decision)) {
	c := classifier{in: in, gate: map[string]Decision{}, late: map[string]Lease{}, orphanPids: map[string][]int{}}
	c.coveredBy = map[string]string{}
	for rel, l := range in.Leases {
		if l.State == LeaseHeld {
			for _, p := range l.Covers {
				c.coveredBy[path.Clean(p)] = rel
			}
		}
	}
	// Supervisor processes first: a recorded orphan supervisor is not
	// evidence that its sandbox lives (it is what the reap will stop).
	for i, e := range in.Entries {
		if e.Kind == events.KindSupervisorProcess {
			d := c.decide(e)
			if d.Verdict == Orphan {
				c.orphanPids[e.ID] = append(c.orphanPids[e.ID], e.Pid)
			}
			each(i, d)
		}
	}
	for i, e := range in.Entries {
		if e.Kind != events.KindSupervisorProcess {
			each(i, c.decide(e))
		}
	}
}

type classifier struct {
	in         Inputs
	coveredBy  map[string]string
	gate       map[string]Decision // per ULID, so /proc and sockets are asked once
	late       map[string]Lease
	orphanPids map[string][]int
}

func keep(e Entry, owner string, v Verdict, format string, a ...any) Decision {
	return Decision{Entry: e, Owner: owner, Verdict: v, Reason: fmt.Sprintf(format, a...)}
}

func (c *classifier) decide(e Entry) Decision {
	j := c.in.Journal
	owner := e.ID
	if owner == "" {
		owner = e.Handle
	}
	switch {
	case j == nil || c.in.Unreadable != "":
		why := "no journal view"
		if c.in.Unreadable != "" {
			why = c.in.Unreadable
		}
		return keep(e, owner, Ambiguous, "journal cannot be fully read, so nothing is reaped: %s", why)
	case e.Symlink:
		return keep(e, owner, Ambiguous, "a symbolic link where a resource should be: never followed, never deleted")
	case e.StatErr != "":
		return keep(e, owner, Ambiguous, "stat failed (not ENOENT): %s", e.StatErr)
	}
	// Owner from the journal first: this attributes even a name that does
	// not parse, and closes the readdir residual for anything journaled.
	if id, ok := j.Owner(e.Rel); ok {
		// Most of a root's entries end here: no formatting.
		return Decision{Entry: e, Owner: id, Verdict: Owned, Reason: "the journal attributes it to sandbox " + id}
	}
	// Leases, probed before the journal was read: a held create intent
	// covers its ULID's disks and a held shadow intent its handle's shadow
	// disks, none of which the journal attributes yet.
	if d, ok := c.leaseVerdict(e, owner); ok {
		return d
	}
	if e.Unparsed {
		return keep(e, "", Ambiguous, "name does not parse as a nexus resource and the journal does not name it")
	}
	if e.Kind == events.KindWatchdogLog {
		return c.watchdogLog(e)
	}
	if e.ID != "" && j.Sandbox(e.ID) && runtimeSocket(e.Kind) {
		// A sandbox owns its VMM's sockets only while the journal records
		// them (from its start to its stop), the rule replay diff applies:
		// one a VMM left without that record (a start cut short) is
		// judged by liveness, so a dead one is reclaimed.
		if kind, ok := j.OpenSaga(e.ID); ok {
			return keep(e, e.ID, Live, "a %s saga of %s is open (recover finishes it)", kind, e.ID)
		}
		return c.liveness(e)
	}
	if e.ID != "" && j.Sandbox(e.ID) {
		return keep(e, e.ID, Owned, "sandbox %s exists (owner from the name)", e.ID)
	}
	if e.Handle != "" {
		if id, ok := j.Handle(e.Handle); ok {
			return keep(e, id, Owned, "sandbox %s has handle %s", id, e.Handle)
		}
	}
	if e.ID != "" {
		if kind, ok := j.OpenSaga(e.ID); ok {
			return keep(e, e.ID, Live, "a %s saga of %s is open (recover finishes it)", kind, e.ID)
		}
	}
	if e.Kind == events.KindSupervisorProcess {
		return keep(e, e.ID, Orphan, "supervisor %s recorded for removed sandbox %s, pid and start time still match (RL-13)", e.Rel, e.ID)
	}
	if e.Legacy {
		return keep(e, "", Orphan, "legacy .shadow.ext4 name carries no handle, so no sandbox can own it")
	}
	if e.ID == "" {
		// Handle-keyed shadow disk or intent: correlated by handle, not by
		// the ULID gate (no process names a handle).
		if e.Kind == events.KindShadowIntent {
			return keep(e, e.Handle, Orphan, "shadow intent lease is free and no sandbox has handle %s", e.Handle)
		}
		if d, ok := c.lateIntent(e, layout.ShadowIntentRel(e.Handle), e.Handle); ok {
			return d
		}
		return keep(e, e.Handle, Orphan, "no sandbox has handle %s and no shadow intent lease is held", e.Handle)
	}
	return c.liveness(e)
}

// watchdogLog judges a client run's watchdog log by its run's record: the
// ledger sweep removes the log with the run, so while the record exists
// the log is the run's; once it is gone (swept, or closed by a nexus that
// left logs behind), nothing will remove the log but a reap.
func (c *classifier) watchdogLog(e Entry) Decision {
	switch p := c.in.Gate.RunRecord(e.Run); p.State {
	case Alive:
		return keep(e, "", Live, "client run %s is in the ledger (runs/): its sweep removes the log with it", e.Run)
	case Dead:
		return keep(e, "", Orphan, "client run %s has no record in runs/: the log outlived its run", e.Run)
	default:
		return keep(e, "", Ambiguous, "cannot tell whether client run %s is in the ledger: %s", e.Run, p.Detail)
	}
}

// leaseVerdict applies the intents' leases: an intent's own, the create
// intent of the entry's ULID, the shadow intent of its handle, and any held
// intent whose covers list the path.
func (c *classifier) leaseVerdict(e Entry, owner string) (Decision, bool) {
	check := func(rel, what string) (Decision, bool) {
		l, ok := c.in.Leases[rel]
		if !ok {
			return Decision{}, false
		}
		switch l.State {
		case LeaseHeld:
			return keep(e, owner, Live, "%s lease is held: a create is in flight", what), true
		case LeaseUnreadable:
			return keep(e, owner, Ambiguous, "intent unreadable (%s), so a live creator cannot be ruled out: inspect %s", l.Err, rel), true
		}
		return Decision{}, false
	}
	if e.Kind == events.KindCreateIntent || e.Kind == events.KindShadowIntent {
		if d, ok := check(e.Rel, string(e.Kind)); ok {
			return d, true
		}
	}
	if e.ID != "" {
		if d, ok := check(layout.CreateIntentRel(e.ID), "create intent"); ok {
			return d, true
		}
	}
	if e.Handle != "" {
		if d, ok := check(layout.ShadowIntentRel(e.Handle), "shadow intent"); ok {
			return d, true
		}
	}
	if rel, ok := c.coveredBy[e.Rel]; ok {
		return keep(e, owner, Live, "covered by %s, whose lease is held", rel), true
	}
	return Decision{}, false
}

// lateIntent handles an intent the scan did not list but that exists now:
// it may have been published in a slot the readdir had passed, so its
// lease was not probed before the journal was read. Keep.
func (c *classifier) lateIntent(e Entry, rel, owner string) (Decision, bool) {
	if _, listed := c.in.Leases[rel]; listed || e.Rel == rel {
		return Decision{}, false
	}
	l, ok := c.late[rel]
	if !ok {
		l = c.in.Gate.Intent(rel)
		c.late[rel] = l
	}
	switch l.State {
	case LeaseGone:
		return Decision{}, false
	case LeaseUnreadable:
		return keep(e, owner, Ambiguous, "intent unreadable (%s), so a live creator cannot be ruled out: inspect %s", l.Err, rel), true
	default:
		return keep(e, owner, Live, "%s appeared after the scan listed its directory", rel), true
	}
}

// liveness is the liveness gate for a ULID-keyed entry with no owner and no
// lease: one /proc scan per run, then the API socket; ambiguity keeps.
func (c *classifier) liveness(e Entry) Decision {
	if d, ok := c.lateIntent(e, layout.CreateIntentRel(e.ID), e.ID); ok {
		return d
	}
	if e.Handle != "" {
		if d, ok := c.lateIntent(e, layout.ShadowIntentRel(e.Handle), e.ID); ok {
			return d
		}
	}
	g, ok := c.gate[e.ID]
	if !ok {
		g = c.runGate(e.ID)
		c.gate[e.ID] = g
	}
	if g.Verdict == Orphan && e.Kind == events.KindSupervisorState {
		// The supervisor's own socket lives inside the directory and can
		// outlive the VM's socket.
		switch p := c.in.Gate.SupervisorSocket(e.ID); p.State {
		case Alive:
			return keep(e, e.ID, Live, "supervisor socket answers: %s", p.Detail)
		case Unsure:
			return keep(e, e.ID, Ambiguous, "supervisor socket probe inconclusive: %s", p.Detail)
		}
	}
	g.Entry = e
	return g
}

func (c *classifier) runGate(id string) Decision {
	switch p := c.in.Gate.Process(id, c.orphanPids[id]); p.State {
	case Alive:
		return Decision{Owner: id, Verdict: Live, Reason: p.Detail}
	case Unsure:
		return Decision{Owner: id, Verdict: Ambiguous, Reason: "/proc scan inconclusive: " + p.Detail}
	}
	switch p := c.in.Gate.Socket(id); p.State {
	case Alive:
		return Decision{Owner: id, Verdict: Live, Reason: "API socket answers: " + p.Detail}
	case Unsure:
		return Decision{Owner: id, Verdict: Ambiguous, Reason: "API socket probe inconclusive: " + p.Detail}
	}
	return Decision{Owner: id, Verdict: Orphan, Reason: fmt.Sprintf("no sandbox %s in the journal, no lease, no process names it, API socket dead", id)}
}

// Order sorts decisions for applying: processes first (so nothing is
// deleted under a running supervisor), intents last (so a crash mid-apply
// still leaves the marker that names what it covered).
func Order(ds []Decision) {
	rank := func(k events.ResourceKind) int {
		switch k {
		case events.KindSupervisorProcess:
			return 0
		case events.KindCreateIntent, events.KindShadowIntent:
			return 2
		}
		return 1
	}
	// Sorted by index, then moved in place along the permutation's
	// cycles: a decision is a few hundred bytes and a root's scan holds
	// one per entry, so neither a copy of them all nor a stable sort's
	// O(n log² n) moves. The index breaks ties, which keeps the order
	// stable.
	idx := make([]int, len(ds))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(i, j int) int {
		if c := cmp.Compare(rank(ds[i].Entry.Kind), rank(ds[j].Entry.Kind)); c != 0 {
			return c
		}
		if c := strings.Compare(ds[i].Entry.Rel, ds[j].Entry.Rel); c != 0 {
			return c
		}
		return cmp.Compare(i, j)
	})
	// ds[to] takes what was at idx[to]; a visited slot is marked -1.
	for start := range idx {
		if idx[start] < 0 {
			continue
		}
		held := ds[start]
		for to := start; ; {
			from := idx[to]
			idx[to] = -1
			if from == start {
				ds[to] = held
				break
			}
			ds[to] = ds[from]
			to = from
		}
	}
}

// Filter selects which entries a run reports and may delete.
type Filter struct {
	Kind    events.ResourceKind
	Sandbox string // a ULID
	// Handle (a safe handle) also matches handle-keyed shadow disks and
	// intents, whose sandbox may be gone.
	Handle    string
	OlderThan int64 // seconds; 0 = any age
	NowUnix   int64
}

// Match reports whether d passes f. --sandbox matches the resolved owner,
// the ULID in the name, or the handle of a shadow disk or intent.
func (f Filter) Match(d Decision) bool {
	if f.Kind != "" && d.Entry.Kind != f.Kind {
		return false
	}
	if f.Sandbox != "" || f.Handle != "" {
		byID := f.Sandbox != "" && (d.Owner == f.Sandbox || d.Entry.ID == f.Sandbox)
		byHandle := f.Handle != "" && d.Entry.Handle == f.Handle
		if !byID && !byHandle {
			return false
		}
	}
	if f.OlderThan > 0 && !d.Entry.ModTime.IsZero() && f.NowUnix-d.Entry.ModTime.Unix() < f.OlderThan {
		return false
	}
	return true
}

// runtimeSocket is a socket under run/ that a sandbox's VMM makes at each
// start and that its stop releases.
func runtimeSocket(k events.ResourceKind) bool {
	switch k {
	case events.KindAPISocket, events.KindAPISocketLock, events.KindVsockSocket, events.KindIIDSocket:
		return true
	}
	return false
}
