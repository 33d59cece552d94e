package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/liveness"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/scan"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/oneline"
	"github.com/nexus-sandbox/nexus/reaper"
	"github.com/nexus-sandbox/nexus/sagas"
)

// ReapOptions select what a reap looks at and whether it deletes.
type ReapOptions struct {
	Apply bool
	// Plan, with Apply, deletes only what that dry run's plan listed.
	Plan   string
	Filter reaper.Filter
	// ProcRoot is /proc unless a test says otherwise.
	ProcRoot      string
	SocketTimeout time.Duration
	// CountOwned, in a dry run, counts the entries the journal gives a
	// sandbox in ReapReport.OwnedCounted instead of listing them in Kept:
	// nearly every entry of a root, one item each, for a report that
	// shows only their number.
	CountOwned bool
}

// ReapItem is one `R` of `nexus reap --json`: the contract in SPEC.md,
// plus the allocated bytes (st_blocks*512).
type ReapItem struct {
	Kind      events.ResourceKind `json:"kind"`
	Path      string              `json:"path"`
	Owner     string              `json:"owner"`
	Verdict   reaper.Verdict      `json:"verdict"`
	Reason    string              `json:"reason"`
	Allocated int64               `json:"allocated_bytes"`
	Error     string              `json:"error,omitempty"`

	entry reaper.Entry
}

// Owned reports whether the journal (or the name, against the journal)
// gives the item to a sandbox: kept as a matter of course, not for a
// reason the report has to show.
func (it ReapItem) Owned() bool { return it.Verdict == reaper.Owned }

// ReapReport is `nexus reap --json`.
type ReapReport struct {
	Apply   bool       `json:"apply"`
	Plan    string     `json:"plan"`
	Scanned int        `json:"scanned"`
	Orphans []ReapItem `json:"orphans"`
	Kept    []ReapItem `json:"kept"`
	Deleted []ReapItem `json:"deleted"`
	Failed  []ReapItem `json:"failed"`
	// Allocated is the total of orphans (dry run) or of deleted (apply).
	Allocated int64 `json:"allocated_bytes"`
	// Journal says why the journal could not be read, when it could not.
	Journal string `json:"journal,omitempty"`
	// ProcReads is how many /proc/<pid>/cmdline files the run read, over
	// ProcScans whole scans (a scan that met a vanished process is retried
	// whole, never per resource).
	ProcReads int `json:"proc_reads"`
	ProcScans int `json:"proc_scans"`
	// ScanErrors are directories that could not be listed.
	ScanErrors []string `json:"scan_errors"`
	// OwnedCounted is how many owned entries were kept and not listed
	// (ReapOptions.CountOwned).
	OwnedCounted int `json:"-"`
}

// KeptCount and OwnedCount are how many entries were kept, and how many
// of them are owned, listed or counted.
func (r ReapReport) KeptCount() int { return len(r.Kept) + r.OwnedCounted }
func (r ReapReport) OwnedCount() int {
	n := r.OwnedCounted
	for _, it := range r.Kept {
		if it.Owned() {
			n++
		}
	}
	return n
}

// ErrJournalUnreadable wraps a failure to read the journal's views: the
// caller keeps everything (ReapUnreadable) rather than judging without them.
var ErrJournalUnreadable = errors.New("journal cannot be fully read")

// journalUnreadable wraps a failed read of the journal's views, unless the
// reap was interrupted: a read cut short says nothing about the journal,
// and nothing was deleted.
func journalUnreadable(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return notStarted(ctx, "reap", err)
	}
	return fmt.Errorf("%w: %w", ErrJournalUnreadable, err)
}

// ErrPlanNotFound means --plan named no recorded reap plan.
var ErrPlanNotFound = errors.New("no such reap plan")

// planChunk bounds the entries of one reap event (about 200 bytes each,
// well under the journal's 1 MiB message limit). Each event costs an fsync.
const planChunk = 2000

// procScanAttempts: a scan that met a vanished or unreadable cmdline is
// repeated whole (never per resource) before its ambiguity is accepted.
const procScanAttempts = 3

// Reap classifies every reapable resource of the state root and, with
// Apply, deletes the orphans: ownership from the journal, joined with a
// fresh scan, intent leases probed before the journal is read and the
// liveness gate. That order is what makes the two observations safe
// together: a lease is released only after its create is journaled.
func (m *Manager) Reap(ctx context.Context, o ReapOptions) (ReapReport, error) {
	root := string(m.Root)
	// 1. The scan, then every listed intent's lease, BEFORE the journal.
	sc, err := scan.Root(root)
	if err != nil {
		return ReapReport{}, err
	}
	leases := probeLeases(root, sc.Entries)
	if m.Hook != nil {
		// Between the two ordered observations: tests freeze the reaper
		// here while a real creator commits and releases its lease.
		m.Hook("reap", "observe-leases", sagas.AfterRecord)
	}
	// 2. Supervisor history before the sandboxes, so every supervisor it
	// lists belongs to a sandbox the later read already shows, unless gone.
	sups := reaper.NewSupervisors()
	if err := m.B.Events(ctx, events.Query{Type: "supervisor"}, func(r events.Record) error {
		sups.Apply(r.Event)
		return nil
	}); err != nil {
		return ReapReport{}, journalUnreadable(ctx, err)
	}
	j, err := m.journalIndex(ctx, sc.Entries)
	if err != nil {
		return ReapReport{}, journalUnreadable(ctx, err)
	}
	o.Filter = o.Filter.Resolve(j.Handle)
	entries := append(sc.Entries, supervisorEntries(sups.Gone(j))...)
	rep := m.judge(o, entries, leases, j, "", sc)
	if j.err != nil {
		return ReapReport{}, journalUnreadable(ctx, j.err)
	}
	if o.Plan != "" {
		if err := m.bindToPlan(ctx, o.Plan, &rep); err != nil {
			return rep, err
		}
	} else {
		rep.Plan = ulid.Make().String()
	}
	if !o.Apply {
		for _, p := range planEvents(rep, false) {
			if _, err := m.B.Append(ctx, events.New(ulid.Make(), time.Now(), "", p)); err != nil {
				// Interrupted while recording the plan of a dry run: no
				// reap started and nothing was deleted, as when interrupted
				// while reading the journal.
				if ctx.Err() != nil {
					return rep, notStarted(ctx, "reap", err)
				}
				return rep, fmt.Errorf("record reap plan: %w", err)
			}
		}
		return rep, nil
	}
	l, err := m.lease(ctx, core.Reap, "reap")
	if err != nil {
		return rep, err
	}
	defer l.Release()
	s := &sagas.Saga{Kind: events.SagaReap, Hook: m.Hook, Steps: []sagas.Step{
		{Name: "decide", Do: func(context.Context) ([]events.Payload, error) { return planEvents(rep, true), nil }},
		{Name: "delete", Do: func(context.Context) ([]events.Payload, error) { return m.applyReap(&rep) }},
	}}
	if err := s.Run(ctx, m.B); err != nil {
		return rep, err
	}
	return rep, nil
}

// journalIndex is the reaper's view of the journal over the backend's
// indexes: the owners of every scanned path asked up front, in batches,
// and each sandbox or handle a name carries asked when the reaper needs
// it (only for what the journal gives no owner), once. Nothing lists
// every sandbox.
func (m *Manager) journalIndex(ctx context.Context, entries []reaper.Entry) (*journalIndex, error) {
	open, err := m.B.OpenSagas(ctx)
	if err != nil {
		return nil, err
	}
	j := &journalIndex{ctx: ctx, b: m.B, owners: make(map[string]string, len(entries)), open: map[string]string{},
		sandboxes: map[string]bool{}, handles: map[string]string{}}
	for _, sg := range open {
		if sg.Sandbox != "" {
			j.open[sg.Sandbox] = string(sg.Kind)
		}
	}
	const batch = 4096
	for i := 0; i < len(entries); i += batch {
		paths := make([]string, 0, batch)
		for _, e := range entries[i:min(i+batch, len(entries))] {
			paths = append(paths, e.Rel)
		}
		owners, err := m.B.PathOwners(ctx, paths)
		if err != nil {
			return nil, err
		}
		for k, p := range paths {
			j.owners[p] = owners[k]
		}
	}
	return j, nil
}

// journalIndex implements reaper.Journal over a Backend. A lookup that
// fails answers "owned" (ambiguity keeps) and is kept in err, which makes
// the whole reap fail as unreadable.
type journalIndex struct {
	ctx       context.Context
	b         Backend
	owners    map[string]string
	open      map[string]string
	sandboxes map[string]bool
	handles   map[string]string
	err       error
}

func (j *journalIndex) fail(err error) {
	if j.err == nil {
		j.err = err
	}
}

func (j *journalIndex) Owner(rel string) (string, bool) {
	id, asked := j.owners[rel]
	if !asked {
		got, err := j.b.PathOwners(j.ctx, []string{rel})
		if err != nil {
			j.fail(err)
			return "", true
		}
		id = got[0]
		j.owners[rel] = id
	}
	return id, id != ""
}

func (j *journalIndex) Sandbox(id string) bool {
	known, asked := j.sandboxes[id]
	if !asked {
		sb, found, err := j.b.Sandbox(j.ctx, id)
		if err != nil {
			j.fail(err)
			return true
		}
		known = found && sb.ID == id
		j.sandboxes[id] = known
	}
	return known
}

func (j *journalIndex) Handle(h string) (string, bool) {
	id, asked := j.handles[h]
	if !asked {
		if handle, ok := layout.HandleOf(h); ok {
			sb, found, err := j.b.Sandbox(j.ctx, handle)
			if err != nil {
				j.fail(err)
				return "", true
			}
			if found && sb.Handle == handle {
				id = sb.ID
			}
		}
		j.handles[h] = id
	}
	return id, id != ""
}

func (j *journalIndex) OpenSaga(id string) (string, bool) {
	kind, ok := j.open[id]
	return kind, ok
}

// ReapUnreadable reports a state root whose journal cannot be fully read:
// everything is kept, since ownership cannot be known, and the report says
// why.
func ReapUnreadable(root string, why string, o ReapOptions) (ReapReport, error) {
	sc, err := scan.Root(root)
	if err != nil {
		return ReapReport{}, err
	}
	m := &Manager{Root: layout.Root(root)}
	rep := m.judge(o, sc.Entries, probeLeases(root, sc.Entries), nil, why, sc)
	rep.Journal = why
	return rep, nil
}

func probeLeases(root string, entries []reaper.Entry) map[string]reaper.Lease {
	leases := map[string]reaper.Lease{}
	for _, e := range entries {
		if reaper.HasLease(e) {
			reaper.AddLease(leases, e, liveness.ProbeIntent(filepath.Join(root, e.Rel)))
		}
	}
	return leases
}

// supervisorEntries turns recorded supervisors of gone sandboxes into
// process resources, but only those whose pid still runs with the recorded
// start time: a reused pid is someone else.
func supervisorEntries(recorded []reaper.Recorded) []reaper.Entry {
	var out []reaper.Entry
	for _, r := range recorded {
		who := proc.Identity{Pid: r.Pid, StartTicks: r.StartTicks}
		alive, err := proc.Alive(who)
		e := reaper.Entry{Name: layout.Name{Kind: events.KindSupervisorProcess, ID: r.Sandbox}, Rel: "/proc/" + strconv.Itoa(r.Pid), Pid: r.Pid, StartTicks: r.StartTicks}
		switch {
		case err != nil:
			e.StatErr = err.Error()
		case !alive:
			continue
		}
		out = append(out, e)
	}
	return out
}

func (m *Manager) judge(o ReapOptions, entries []reaper.Entry, leases map[string]reaper.Lease, j reaper.Journal, unreadable string, sc scan.Result) ReapReport {
	// An unfiltered run keeps nearly every entry: its list is sized once.
	countOwned := o.CountOwned && !o.Apply
	kept := 0
	if o.Filter == (reaper.Filter{}) && !countOwned {
		kept = len(entries)
	}
	rep := ReapReport{Apply: o.Apply, Orphans: []ReapItem{}, Kept: make([]ReapItem, 0, kept), Deleted: []ReapItem{}, Failed: []ReapItem{}, ScanErrors: sc.Errors}
	var procs *liveness.Procs
	for i := 0; i < procScanAttempts; i++ {
		procs = liveness.ScanProcs(o.ProcRoot)
		rep.ProcReads += procs.Reads
		rep.ProcScans++
		if len(procs.Incomplete) == 0 {
			break
		}
	}
	gate := &liveness.Gate{Root: string(m.Root), Procs: procs, Timeout: o.SocketTimeout}
	if o.Filter.OlderThan > 0 && o.Filter.NowUnix == 0 {
		o.Filter.NowUnix = time.Now().Unix()
	}
	// Each decision is filtered as it is made, and an owned one only
	// counted when the report shows their number alone. Order ranks the
	// recorded supervisor processes, which ClassifyEach decides first,
	// before the rest and keeps each rank's order: what is kept sorts as
	// it would among every entry's.
	ds := make([]reaper.Decision, 0, kept)
	reaper.ClassifyEach(reaper.Inputs{Entries: entries, Leases: leases, Journal: j, Unreadable: unreadable, Gate: gate}, func(_ int, d reaper.Decision) {
		switch {
		case !o.Filter.Match(d):
		case countOwned && d.Verdict == reaper.Owned:
			rep.OwnedCounted++
		default:
			ds = append(ds, d)
		}
	})
	reaper.Order(ds)
	rep.Scanned = len(sc.Entries)
	for _, d := range ds {
		it := m.item(d)
		if d.Verdict == reaper.Orphan {
			if d.Entry.Dir {
				it.Allocated = scan.TreeAllocated(string(m.Root), d.Entry.Rel)
			}
			rep.Orphans = append(rep.Orphans, it)
			rep.Allocated += it.Allocated
		} else {
			rep.Kept = append(rep.Kept, it)
		}
	}
	return rep
}

// decision is the reaper's verdict it reports.
func (it ReapItem) decision() reaper.Decision {
	return reaper.Decision{Entry: it.entry, Owner: it.Owner, Verdict: it.Verdict, Reason: it.Reason}
}

// with is it reporting d, the reaper's verdict on it judged again.
func (it ReapItem) with(d reaper.Decision) ReapItem {
	it.Owner, it.Verdict, it.Reason = d.Owner, d.Verdict, d.Reason
	return it
}

func (m *Manager) item(d reaper.Decision) ReapItem {
	p := d.Entry.Rel
	if !filepath.IsAbs(p) {
		p = filepath.Join(string(m.Root), p)
	}
	return ReapItem{Kind: d.Entry.Kind, Path: p, Owner: d.Owner, Verdict: d.Verdict, Reason: d.Reason, Allocated: d.Entry.Allocated, entry: d.Entry}
}

// bindToPlan narrows the orphans to those plan id listed. Each was just
// judged again (lease, owner, liveness); one that changed is kept, saying so.
func (m *Manager) bindToPlan(ctx context.Context, id string, rep *ReapReport) error {
	planned := map[string]bool{}
	found := false
	err := m.B.Events(ctx, events.Query{Type: string(events.ReapDecided)}, func(r events.Record) error {
		p, ok := r.Event.Payload.(events.ReapDecidedEvent)
		if !ok || p.Plan != id {
			return nil
		}
		found = true
		for _, e := range p.Entries {
			if e.Verdict == string(reaper.Orphan) {
				planned[reaper.PlanKey(e.Kind, e.Path)] = true
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: %s", ErrPlanNotFound, id)
	}
	rep.Plan = id
	against := func(it ReapItem) (ReapItem, bool) {
		d, del := reaper.AgainstPlan(it.decision(), id, planned[reaper.PlanKey(it.Kind, it.entry.Rel)])
		return it.with(d), del
	}
	for i, it := range rep.Kept {
		rep.Kept[i], _ = against(it)
	}
	orphans := []ReapItem{}
	rep.Allocated = 0
	for _, it := range rep.Orphans {
		it, del := against(it)
		if del {
			orphans = append(orphans, it)
			rep.Allocated += it.Allocated
			continue
		}
		rep.Kept = append(rep.Kept, it)
	}
	rep.Orphans = orphans
	return nil
}

func toEntry(it ReapItem) events.ReapEntry {
	return events.ReapEntry{Kind: it.Kind, Path: it.entry.Rel, Owner: it.Owner, Verdict: string(it.Verdict), Reason: it.Reason, Allocated: it.Allocated, Error: it.Error}
}

// planEvents records every verdict that is not "owned", in parts.
func planEvents(rep ReapReport, apply bool) []events.Payload {
	var list []events.ReapEntry
	owned := rep.OwnedCounted
	for _, it := range rep.Orphans {
		list = append(list, toEntry(it))
	}
	for _, it := range rep.Kept {
		if it.Verdict == reaper.Owned {
			owned++
			continue
		}
		list = append(list, toEntry(it))
	}
	parts := max(1, (len(list)+planChunk-1)/planChunk)
	out := make([]events.Payload, 0, parts)
	for i := 0; i < parts; i++ {
		chunk := list[min(i*planChunk, len(list)):min((i+1)*planChunk, len(list))]
		out = append(out, events.ReapDecidedEvent{Plan: rep.Plan, Apply: apply, Part: i + 1, Parts: parts, Scanned: rep.Scanned, Owned: owned, Entries: append([]events.ReapEntry{}, chunk...)})
	}
	return out
}

// applyReap stops orphaned supervisors, deletes every orphan symlink-safely,
// re-stats what it deleted (the verify pass), and returns the events that
// say what was deleted and what failed.
func (m *Manager) applyReap(rep *ReapReport) ([]events.Payload, error) {
	b, err := fsx.NewBatch(string(m.Root))
	if err != nil {
		return nil, err
	}
	var removed []ReapItem
	// From here Allocated counts what is freed, not what was planned.
	rep.Allocated = 0
	fail := func(it ReapItem, msg string) {
		it.Error = msg
		rep.Failed = append(rep.Failed, it)
	}
	reaping := map[string]bool{}
	for _, it := range rep.Orphans {
		reaping[it.entry.Rel] = true
	}
	for _, it := range rep.Orphans {
		e := it.entry
		if e.Kind == events.KindSupervisorProcess {
			who := proc.Identity{Pid: e.Pid, StartTicks: e.StartTicks}
			if err := proc.Terminate(who, 5*time.Second); err != nil {
				fail(it, err.Error())
				continue
			}
			if alive, _ := proc.Alive(who); alive {
				fail(it, "terminate reported success but the process still runs")
				continue
			}
			rep.Deleted = append(rep.Deleted, it)
			rep.Allocated += it.Allocated
			continue
		}
		if rel, ok := reaper.IntentBeforeDelete(e, func(rel string) bool { return reaping[rel] }); ok {
			if ok, _ := b.Exists(rel); ok {
				rep.Kept = append(rep.Kept, it.with(reaper.IntentAppeared(it.decision())))
				continue
			}
		}
		remove := b.Remove
		if !e.Dir {
			remove = b.RemoveFile // the scan saw a file, not a link: one unlinkat
		}
		err := remove(e.Rel)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// Someone (a concurrent rm, another reaper) finished the job
			// between scan and delete: not a failure, and not ours to claim.
			// It stays listed in orphans only.
		case err != nil:
			fail(it, oneline.Of(err.Error()))
		default:
			removed = append(removed, it)
		}
	}
	// Verify pass: a reported success is not evidence of a removal.
	for _, it := range removed {
		still, err := b.Exists(it.entry.Rel)
		switch {
		case err != nil:
			fail(it, "verify: "+oneline.Of(err.Error()))
		case still:
			fail(it, "delete reported success but the path still exists")
		default:
			rep.Deleted = append(rep.Deleted, it)
			rep.Allocated += it.Allocated
		}
	}
	if err := b.Close(); err != nil {
		return nil, fmt.Errorf("sync reaped directories: %w", err)
	}
	return appliedEvents(rep), nil
}

func appliedEvents(rep *ReapReport) []events.Payload {
	n := max(len(rep.Deleted), len(rep.Failed))
	parts := max(1, (n+planChunk-1)/planChunk)
	out := make([]events.Payload, 0, parts)
	conv := func(list []ReapItem, i int) []events.ReapEntry {
		out := []events.ReapEntry{}
		for _, it := range list[min(i*planChunk, len(list)):min((i+1)*planChunk, len(list))] {
			out = append(out, toEntry(it))
		}
		return out
	}
	for i := 0; i < parts; i++ {
		out = append(out, events.ReapAppliedEvent{Plan: rep.Plan, Part: i + 1, Parts: parts, Deleted: conv(rep.Deleted, i), Failed: conv(rep.Failed, i)})
	}
	return out
}
