package ledger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
	format "github.com/nexus-sandbox/nexus/ledger"
)

// entry is one run found in the directory: which of its files exist.
type entry struct {
	run                  string
	record, sbx, network bool
}

// lockTarget is the file a sweeper locks: the one deleted last. It is the
// record, unless the run has none (a foreign writer crashed before writing
// it), then the sandboxes list, then the networks list.
func (e entry) lockTarget(dir string) string {
	switch {
	case e.record:
		return recordPath(dir, e.run)
	case e.sbx:
		return listPath(dir, e.run, Sandboxes)
	default:
		return listPath(dir, e.run, Networks)
	}
}

// scan lists the runs under dir. Names that are not <valid-run-id><suffix>
// (temporary files start with ".") are ignored: they belong to no run.
func scan(dir string) ([]entry, error) {
	des, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	byRun := map[string]*entry{}
	var order []string
	for _, de := range des {
		name := de.Name()
		for _, suf := range []string{format.RecordSuffix, format.SandboxesSuffix, format.NetworksSuffix} {
			run, ok := strings.CutSuffix(name, suf)
			if !ok || !layout.ValidRunID(run) || !de.Type().IsRegular() {
				continue
			}
			e := byRun[run]
			if e == nil {
				e = &entry{run: run}
				byRun[run] = e
				order = append(order, run)
			}
			switch suf {
			case format.RecordSuffix:
				e.record = true
			case format.SandboxesSuffix:
				e.sbx = true
			default:
				e.network = true
			}
		}
	}
	sort.Strings(order)
	out := make([]entry, 0, len(order))
	for _, r := range order {
		out = append(out, *byRun[r])
	}
	return out, nil
}

// Planned is a run's observation and the decision on it.
type Planned struct {
	format.Observation
	format.Decision
	Sandboxes, Networks []string // read only when the run is swept
	entry               entry
}

// observe decides on a run from its record alone (and, when the rule needs
// them, the owner's /proc entry or the files' age): the happy path opens one
// small file per run and finds its liveness lock held; a record without the
// lock costs a read of it and of one /proc entry. Invalid lines in the lists do not
// make a run unparseable; they are skipped when the run is swept.
func observe(dirfd int, dir string, e entry, self format.Self, now time.Time) (Planned, error) {
	p := Planned{entry: e}
	p.Run = e.run
	if e.record {
		locked, data, err := probeRecord(dirfd, recordPath(dir, e.run))
		switch {
		case locked:
			// Its owner is alive: nothing else about the run matters.
			p.Locked = true
			p.Decision = format.Decide(p.Observation, self)
			return p, nil
		case err != nil:
			p.ParseErr = fmt.Errorf("%w: %v", format.ErrMalformed, err)
		default:
			p.Record, p.ParseErr = format.ParseRecord(data, e.run)
		}
	} else {
		p.ParseErr = fmt.Errorf("%w: no record file", format.ErrMalformed)
	}
	if p.ParseErr != nil && !errors.Is(p.ParseErr, format.ErrSchemaTooNew) {
		p.Age = now.Sub(newestMtime(dir, e))
	}
	if format.NeedsOwner(p.Observation, self) {
		var err error
		if p.Owner, err = OwnerOf(p.Record.Pid); err != nil {
			return p, fmt.Errorf("ledger %s: owner pid %d: %w", e.run, p.Record.Pid, err)
		}
	}
	p.Decision = format.Decide(p.Observation, self)
	return p, nil
}

// newestMtime is the latest change to any of a run's files: a writer that
// is mid-write touches one of them.
func newestMtime(dir string, e entry) time.Time {
	var newest time.Time
	for _, path := range []string{recordPath(dir, e.run), listPath(dir, e.run, Sandboxes), listPath(dir, e.run, Networks)} {
		if st, err := os.Stat(path); err == nil && st.ModTime().After(newest) {
			newest = st.ModTime()
		}
	}
	return newest
}

// ListedSandboxes is the sandboxes a run's ledger lists: what a sweep of
// it would remove. It reads without the run's flock, for a dry run only.
func ListedSandboxes(dir, run string) []string {
	sandboxes, _ := readLists(dir, run)
	return sandboxes
}

// readLists reads a run's two lists; a missing list is empty.
func readLists(dir, run string) (sandboxes, networks []string) {
	for _, k := range []Kind{Sandboxes, Networks} {
		data, err := readIn(listPath(dir, run, k))
		if err != nil {
			continue
		}
		names, _ := format.ParseNames(data) // valid names even when a line is not
		if k == Sandboxes {
			sandboxes = names
		} else {
			networks = names
		}
	}
	return sandboxes, networks
}

// Plan decides on every run under dir without changing anything. It is the
// whole cost of a sweep that finds nothing to do.
func Plan(dir string, self format.Self, now time.Time) ([]Planned, error) {
	entries, err := scan(dir)
	if err != nil {
		return nil, err
	}
	dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		dirfd = -1
	} else {
		defer unix.Close(dirfd)
	}
	out := make([]Planned, len(entries))
	// Each run costs two small reads, all syscall time: spread them over the
	// CPUs. Small directories are not worth the goroutines.
	workers := min(runtime.GOMAXPROCS(0), (len(entries)+planChunk-1)/planChunk)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				end := int(next.Add(planChunk))
				start := end - planChunk
				if start >= len(entries) {
					return
				}
				for i := start; i < min(end, len(entries)); i++ {
					p, err := observe(dirfd, dir, entries[i], self, now)
					if err != nil {
						// A /proc read that fails for another reason than
						// "gone" is ambiguity: keep.
						p.Decision = format.Decision{Verdict: format.Keep, Reason: "owner unreadable: " + err.Error()}
					}
					out[i] = p
				}
			}
		}()
	}
	wg.Wait()
	return out, nil
}

// planChunk is how many runs a Plan worker takes at a time.
const planChunk = 64

// AnySweep reports whether a plan has a run to sweep.
func AnySweep(plan []Planned) bool {
	for _, p := range plan {
		if p.Verdict == format.Sweep {
			return true
		}
	}
	return false
}

// Actions are what a sweep needs done outside the ledger; nexus backs them
// with the lifecycle manager and the journal.
type Actions interface {
	// RemoveSandbox tears name down; found false means it did not exist.
	RemoveSandbox(ctx context.Context, name string) (found bool, err error)
	// RemoveNetwork is the same for a network.
	RemoveNetwork(ctx context.Context, name string) (found bool, err error)
	// Record journals the decision to sweep a run, with what it removed.
	Record(ctx context.Context, ev events.RunSweptEvent) error
	// RecordKept journals a sweep's keep decisions.
	RecordKept(ctx context.Context, ev events.RunKeptEvent) error
}

// Apply sweeps every run the plan says to sweep, each under its flock, then
// journals the keep decisions (KeptEvents), and reports every run. A failed
// removal leaves that run's ledger in place for the next sweep and is
// reported, not returned; the error return is for a failure to journal.
func Apply(ctx context.Context, dir string, plan []Planned, self format.Self, by string, act Actions) ([]format.Outcome, error) {
	out := make([]format.Outcome, 0, len(plan))
	for _, p := range plan {
		o := format.Outcome{Run: p.Run, Verdict: string(p.Verdict), Reason: p.Reason}
		if p.Verdict == format.Sweep {
			if err := sweepRun(ctx, dir, p.entry, self, by, false, act, &o); err != nil {
				return out, err
			}
		}
		out = append(out, o)
	}
	for _, ev := range KeptEvents(by, self, time.Now(), out) {
		if err := act.RecordKept(ctx, ev); err != nil {
			return out, fmt.Errorf("journal the sweep's keep decisions: %w", err)
		}
	}
	return out, nil
}

// Outcomes are a plan's decisions as a sweep that acted on none of them
// reports them.
func Outcomes(plan []Planned) []format.Outcome {
	out := make([]format.Outcome, 0, len(plan))
	for _, p := range plan {
		out = append(out, format.Outcome{Run: p.Run, Verdict: string(p.Verdict), Reason: p.Reason})
	}
	return out
}

// keptPerEvent bounds the runs one run.kept event names (about 30 bytes
// each), far below the journal's message size limit.
const keptPerEvent = 2000

// JournalKept appends the keep decisions of a sweep through appendEvents
// (a journal backend's Append).
func JournalKept(ctx context.Context, appendEvents func(context.Context, ...events.Event) ([]uint64, error), evs []events.RunKeptEvent) error {
	for _, ev := range evs {
		if _, err := appendEvents(ctx, events.New(ulid.Make(), time.Now().UTC(), "", ev)); err != nil {
			return fmt.Errorf("journal run.kept: %w", err)
		}
	}
	return nil
}

// KeptEvents renders a sweep's keep decisions as run.kept events: every
// kept run but the sweeper's own, grouped by reason in the order the
// reasons first occur, split into parts of at most keptPerEvent runs. A
// sweep that kept nothing gives none.
func KeptEvents(by string, self format.Self, at time.Time, out []format.Outcome) []events.RunKeptEvent {
	var groups []events.KeptRuns
	index := map[string]int{}
	n := 0
	for _, o := range out {
		if o.Verdict != string(format.Keep) || o.Reason == format.ReasonSelf {
			continue
		}
		i, ok := index[o.Reason]
		if !ok {
			i = len(groups)
			index[o.Reason] = i
			groups = append(groups, events.KeptRuns{Reason: o.Reason})
		}
		groups[i].Runs = append(groups[i].Runs, o.Run)
		n++
	}
	if n == 0 {
		return nil
	}
	var evs []events.RunKeptEvent
	cur := events.RunKeptEvent{By: by, Sweeper: self.Run, Driver: self.Driver, AtMs: at.UnixMilli()}
	room := keptPerEvent
	for _, g := range groups {
		for len(g.Runs) > 0 {
			take := min(room, len(g.Runs))
			cur.Kept = append(cur.Kept, events.KeptRuns{Reason: g.Reason, Runs: g.Runs[:take]})
			g.Runs, room = g.Runs[take:], room-take
			if room == 0 {
				evs = append(evs, cur)
				cur.Kept, room = nil, keptPerEvent
			}
		}
	}
	if len(cur.Kept) > 0 {
		evs = append(evs, cur)
	}
	for i := range evs {
		evs[i].Part, evs[i].Parts = i+1, len(evs)
	}
	return evs
}

// SweepOwn sweeps one run whatever its owner's state: the watchdog calls it
// once its owner's pipe has closed. ok false means the run's files were gone
// already (a clean shutdown, or another sweeper).
func SweepOwn(ctx context.Context, dir, run string, self format.Self, by string, act Actions) (format.Outcome, bool, error) {
	entries, err := scan(dir)
	if err != nil {
		return format.Outcome{}, false, err
	}
	for _, e := range entries {
		if e.run == run {
			o := format.Outcome{Run: run, Verdict: string(format.Sweep), Reason: format.ReasonWatchdog}
			err := sweepRun(ctx, dir, e, self, by, true, act, &o)
			return o, o.Skipped == "", err
		}
	}
	return format.Outcome{Run: run}, false, nil
}

func sweepRun(ctx context.Context, dir string, e entry, self format.Self, by string, forced bool, act Actions, o *format.Outcome) error {
	target := e.lockTarget(dir)
	lk, err := lockRecord(target, true)
	switch {
	case errors.Is(err, unix.EWOULDBLOCK):
		o.Skipped = "another process holds the run's lock"
		return nil
	case errors.Is(err, os.ErrNotExist):
		o.Skipped = "already swept"
		return nil
	case err != nil:
		o.Error = err.Error()
		return nil
	}
	defer lk.Close()
	// The file may have been deleted (by a sweeper that held the lock before
	// us) between our open and our lock: then it is not the run's file.
	var held, now unix.Stat_t
	if unix.Fstat(int(lk.Fd()), &held) != nil || unix.Stat(target, &now) != nil || held.Ino != now.Ino || held.Nlink == 0 {
		o.Skipped = "already swept"
		return nil
	}
	// Decide again under the lock, on what the files say now.
	p, err := observe(-1, dir, e, self, time.Now())
	if err != nil {
		o.Error = err.Error()
		return nil
	}
	if !forced && p.Verdict != format.Sweep {
		o.Verdict, o.Reason = string(p.Verdict), p.Reason
		return nil
	}
	if !forced {
		o.Reason = p.Reason
	}
	p.Sandboxes, p.Networks = readLists(dir, e.run)
	for _, name := range p.Sandboxes {
		found, err := act.RemoveSandbox(ctx, name)
		if err != nil {
			o.Error = fmt.Sprintf("remove sandbox %s: %v", name, err)
			return nil
		}
		if found {
			o.Removed = append(o.Removed, name)
		} else {
			o.NotFound = append(o.NotFound, name)
		}
		// Not dropped one by one: nothing adds to a dead run's list, and a
		// name re-swept after an interrupted sweep is just "not found".
	}
	for _, name := range p.Networks {
		if _, err := act.RemoveNetwork(ctx, name); err != nil {
			o.Error = fmt.Sprintf("remove network %s: %v", name, err)
			return nil
		}
		o.Networks = append(o.Networks, name)
	}
	ev := events.RunSweptEvent{RunID: e.run, Verdict: string(format.Sweep), Reason: o.Reason, By: by,
		Pid: p.Record.Pid, Driver: p.Record.Driver, Removed: o.Removed, NotFound: o.NotFound, Networks: o.Networks}
	if err := act.Record(ctx, ev); err != nil {
		return fmt.Errorf("journal sweep of run %s: %w", e.run, err)
	}
	if err := deleteFiles(dir, e.run); err != nil {
		o.Error = err.Error()
	}
	return nil
}
