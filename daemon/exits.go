package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/store"
)

// watchExits makes exits facts while the daemon runs: it watches every VMM
// and supervisor the journal records as running (those recorded before
// the daemon started too, by their recorded pid + start time) through a
// pidfd each, and journals vmm.exited or supervisor.exited when one ends
// and projections.JudgeExit says nothing else accounts for it (an exit
// during a stop, rm, start, recover or create-like saga of the sandbox is
// that saga's, which journals the outcome itself). It follows the journal
// to learn of processes started and stopped after it began. The returned
// function stops it and waits for it.
func watchExits(ctx context.Context, n *store.Store) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	w := &exitWatcher{n: n, bySandbox: map[string]map[projections.Watched]context.CancelFunc{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

type exitWatcher struct {
	n *store.Store

	mu        sync.Mutex
	bySandbox map[string]map[projections.Watched]context.CancelFunc
	wg        sync.WaitGroup

	// journalMu serialises judging and appending, so two watches of one
	// process (an old one finishing, a new one from a reconcile) never
	// both journal its exit: the second judges after the first folded.
	journalMu sync.Mutex
}

func (w *exitWatcher) run(ctx context.Context) {
	defer w.wg.Wait()
	var since uint64
	var initial []projections.Watched
	w.n.View(func(v store.Views) { since = v.Seq() })
	live, err := w.n.WithProcesses(ctx)
	if err != nil {
		// Without the list the watcher cannot tell which exits are due;
		// the daemon goes on serving, and says why exits go unjournaled.
		warn(fmt.Errorf("exit watcher: reading the sandboxes with running processes: %w", err))
	}
	for _, sb := range live {
		initial = append(initial, sb.Watched()...)
	}
	w.mu.Lock()
	for _, t := range initial {
		w.watchLocked(ctx, t)
	}
	w.mu.Unlock()
	for {
		err := w.n.Events(ctx, store.Query{Since: since + 1, Follow: true}, func(r store.Record) error {
			since = r.Seq
			if r.Event.Sandbox != "" {
				w.reconcile(ctx, r.Event.Sandbox)
			}
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		warn(fmt.Errorf("exit watcher: following the journal after %d: %w (retrying)", since, err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// reconcile makes the watches of one sandbox match what the journal now
// records as running.
func (w *exitWatcher) reconcile(ctx context.Context, sandbox string) {
	var want []projections.Watched
	var err error
	w.n.View(func(v store.Views) {
		var sb *projections.Sandbox
		if sb, err = v.Sandbox(sandbox); sb != nil {
			want = sb.Watched()
		}
	})
	if err != nil {
		warn(fmt.Errorf("exit watcher: sandbox %s: %w", sandbox, err))
		return // its watches stay as they are: none ended on a read error
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for t, cancel := range w.bySandbox[sandbox] {
		if !contains(want, t) {
			cancel()
			w.forgetLocked(t)
		}
	}
	for _, t := range want {
		if _, ok := w.bySandbox[sandbox][t]; !ok {
			w.watchLocked(ctx, t)
		}
	}
}

func (w *exitWatcher) watchLocked(ctx context.Context, t projections.Watched) {
	wctx, cancel := context.WithCancel(ctx)
	if w.bySandbox[t.Sandbox] == nil {
		w.bySandbox[t.Sandbox] = map[projections.Watched]context.CancelFunc{}
	}
	w.bySandbox[t.Sandbox][t] = cancel
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer cancel()
		x, err := proc.WaitExit(wctx, proc.Identity{Pid: t.Process.Pid, StartTicks: t.Process.StartTicks})
		if wctx.Err() != nil {
			return // no longer recorded as running, or the daemon stops
		}
		if err != nil {
			warn(fmt.Errorf("exit watcher: %s pid %d of sandbox %s: %w", t.Role, t.Process.Pid, t.Sandbox, err))
		} else {
			w.journal(ctx, t, x)
		}
		w.mu.Lock()
		w.forgetLocked(t)
		w.mu.Unlock()
	}()
}

func (w *exitWatcher) forgetLocked(t projections.Watched) {
	delete(w.bySandbox[t.Sandbox], t)
	if len(w.bySandbox[t.Sandbox]) == 0 {
		delete(w.bySandbox, t.Sandbox)
	}
}

// journal appends t's exit if, judged now, nothing else accounts for it.
// A failed append (a full disk, say) is judged and tried again until it
// lands, is no longer due, or the daemon stops.
func (w *exitWatcher) journal(ctx context.Context, t projections.Watched, x proc.Exit) {
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		w.journalMu.Lock()
		var due bool
		var rev uint64
		var err error
		w.n.View(func(v store.Views) {
			var sb *projections.Sandbox
			if sb, err = v.Sandbox(t.Sandbox); err != nil {
				return
			}
			due, _ = projections.JudgeExit(sb, v.Sagas.Open(), t)
			if sb != nil {
				rev = sb.Rev
			}
		})
		if due {
			// The judgement expects the sandbox as it was judged: a saga
			// that opened since makes the journal refuse, and we judge again.
			e := events.New(ulid.Make(), time.Now().UTC(), t.Sandbox, projections.ExitPayload(t, exitOf(x)))
			_, err = w.n.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(t.Sandbox), Seq: rev}}, e)
		}
		w.journalMu.Unlock()
		// Done when judged not due or journaled; a failed read or append
		// is judged again.
		if err == nil || ctx.Err() != nil {
			return
		}
		if errors.Is(err, core.ErrStale) {
			continue
		}
		warn(fmt.Errorf("exit watcher: journal the exit of %s pid %d of sandbox %s: %w (retrying)", t.Role, t.Process.Pid, t.Sandbox, err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

func exitOf(x proc.Exit) events.ProcessExit {
	switch {
	case !x.Known:
		return events.ProcessExit{Status: events.ExitUnknown, By: "daemon"}
	case x.Signal != 0:
		return events.ProcessExit{Status: events.ExitKilled, Code: int(x.Signal), Signal: unix.SignalName(x.Signal), By: "daemon"}
	default:
		return events.ProcessExit{Status: events.ExitExited, Code: x.Code, By: "daemon"}
	}
}

func contains(list []projections.Watched, t projections.Watched) bool {
	for _, x := range list {
		if x == t {
			return true
		}
	}
	return false
}

// warn logs a fault the exit watcher retries or works around.
func warn(err error) { slog.Warn(err.Error(), "component", "exit-watcher") }
