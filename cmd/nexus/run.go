package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	hostledger "github.com/nexus-sandbox/nexus/host/ledger"
	"github.com/nexus-sandbox/nexus/ledger"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/node"
	"github.com/nexus-sandbox/nexus/oneline"
	"github.com/nexus-sandbox/nexus/session"
)

func driverOf(g *globals) string {
	if g.driver == "" {
		return lifecycle.DriverCloudHypervisor
	}
	return g.driver
}

// runCmd binds every sandbox its command creates (through NEXUS_RUN_ID) to
// the command's lifetime.
func runCmd(g *globals) *cobra.Command {
	var keep bool
	c := &cobra.Command{
		Use:   "run [--keep] -- CMD [ARG...]",
		Short: "Run a command with sandboxes bound to its lifetime",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{errors.New("run needs a command after --")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := runBound(cmd.Context(), g, keep, args)
			if err != nil {
				return err
			}
			if code != 0 {
				// The command's own exit status, after the cleanup.
				return exitStatus{code}
			}
			return nil
		},
	}
	c.Flags().SetInterspersed(false)
	c.Flags().BoolVar(&keep, "keep", false, "do not bind: sandboxes the command creates are kept (never listed, never reaped)")
	return c
}

func runBound(ctx context.Context, g *globals, keep bool, argv []string) (int, error) {
	root, err := node.PrepareRoot(g.stateDir)
	if err != nil {
		return 0, err
	}
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, client.EnvRunID+"=") {
			env = append(env, kv)
		}
	}
	// The command's own nexus calls reach the same state root and driver.
	env = append(env, "NEXUS_STATE_DIR="+root)
	if g.driver != "" {
		env = append(env, "NEXUS_DRIVER="+g.driver)
	}
	var cl *client.Client
	if !keep {
		exe, err := os.Executable()
		if err != nil {
			return 0, err
		}
		cl, err = client.New(client.Options{Nexus: exe, StateDir: root, Driver: driverOf(g)})
		if err != nil {
			return 0, err
		}
		if err := cl.Begin(ctx); err != nil {
			return 0, err
		}
		if err := cl.SweepErr(); err != nil {
			fmt.Fprintf(os.Stderr, "nexus: run: init-time sweep (continuing): %s\n", oneline.Of(err.Error()))
		}
		env = append(env, cl.Env()...)
	}
	child.Env = env
	code, runErr := waitForwarding(ctx, child)
	if cl != nil {
		// The command's sandboxes go with it; the cleanup must finish even
		// when we were asked to stop.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if err := cl.Close(cctx); err != nil {
			return code, errors.Join(runErr, fmt.Errorf("run %s: cleanup: %w", cl.RunID(), err))
		}
	}
	return code, runErr
}

// waitForwarding runs child and passes SIGINT/SIGTERM (which cancel ctx)
// on to it as SIGTERM, then waits for it.
func waitForwarding(ctx context.Context, child *exec.Cmd) (int, error) {
	if err := child.Start(); err != nil {
		return 0, fmt.Errorf("run: %w", err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			child.Process.Signal(syscall.SIGTERM)
		case <-done:
		}
	}()
	err := child.Wait()
	close(done)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return 0, err
}

// readKept reads the run.kept events a client hands over on stdin: the
// keep decisions of the init-time sweep it ran in its own process, which
// opens no journal (see docs/ledger.md).
func readKept(r io.Reader) ([]events.RunKeptEvent, error) {
	data, err := io.ReadAll(io.LimitReader(r, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("run.kept events on stdin: %w", err)
	}
	var evs []events.RunKeptEvent
	if err := json.Unmarshal(data, &evs); err != nil {
		return nil, usageError{fmt.Errorf("stdin is not a JSON array of run.kept events: %v", err)}
	}
	for _, ev := range evs {
		if ev.By == "" || ev.Driver == "" || ev.Part < 1 || ev.Part > ev.Parts || len(ev.Kept) == 0 {
			return nil, usageError{fmt.Errorf("incomplete run.kept event on stdin (by %q, driver %q, part %d of %d, %d groups)", ev.By, ev.Driver, ev.Part, ev.Parts, len(ev.Kept))}
		}
		for _, k := range ev.Kept {
			for _, run := range k.Runs {
				if !ledger.ValidRunID(run) {
					return nil, usageError{fmt.Errorf("run.kept event on stdin: %q is not a run id", run)}
				}
			}
		}
	}
	return evs, nil
}

func ledgerCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "ledger", Short: "Client-run ledgers under <state-root>/runs/ (see docs/ledger.md)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{errors.New("ledger needs a subcommand: ls, sweep")}
		}}
	var lsOut *output
	ls := &cobra.Command{Use: "ls", Short: "Show every run and what a sweep would decide", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			root, err := node.PrepareRoot(g.stateDir)
			if err != nil {
				return err
			}
			plan, err := hostledger.Plan(hostledger.Dir(root), ledger.Self{Driver: driverOf(g)}, time.Now())
			if err != nil {
				return err
			}
			return printOutcomes(cmd, lsOut, plannedOutcomes(root, plan), false)
		}}
	lsOut = addOutput(ls, true)

	var sweepOut *output
	var sweepDry bool
	var exclude string
	sweep := &cobra.Command{Use: "sweep", Short: "Remove the sandboxes and ledgers of dead runs", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sweepDry {
				// What ledger ls shows: each run's verdict, nothing swept.
				root, err := node.PrepareRoot(g.stateDir)
				if err != nil {
					return err
				}
				plan, err := hostledger.Plan(hostledger.Dir(root), ledger.Self{Run: exclude, Driver: driverOf(g)}, time.Now())
				if err != nil {
					return err
				}
				return printOutcomes(cmd, sweepOut, plannedOutcomes(root, plan), false)
			}
			out, err := sweepRuns(cmd.Context(), g, exclude, "init")
			if err != nil {
				return err
			}
			if err := printOutcomes(cmd, sweepOut, out, true); err != nil {
				return err
			}
			for _, o := range out {
				if o.Error != "" {
					return fmt.Errorf("sweep of run %s failed: %s", o.Run, o.Error)
				}
			}
			return nil
		}}
	sweepOut = addOutput(sweep, true)
	sweep.Flags().BoolVar(&sweepDry, "dry-run", false, "show each run's verdict (what ledger ls shows); sweep nothing")
	sweep.Flags().StringVar(&exclude, "exclude", "", "the caller's own run, never swept")
	sweep.Flags().MarkHidden("exclude")

	journal := &cobra.Command{Use: "journal-kept", Hidden: true, Args: noArgs,
		Short: "Journal the run.kept events (JSON) on stdin: a client's in-process sweep decisions",
		RunE: func(cmd *cobra.Command, _ []string) error {
			evs, err := readKept(cmd.InOrStdin())
			if err != nil {
				return err
			}
			return withManager(cmd.Context(), g, func(m *lifecycle.Manager) error { return session.JournalKept(cmd.Context(), m, evs) })
		}}

	var run string
	watchdog := &cobra.Command{Use: "watchdog --run RUN", Hidden: true, Args: noArgs,
		Short: "Wait for EOF on stdin (the run's owner died or closed), then sweep the run",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return watchRun(cmd, g, run)
		}}
	watchdog.Flags().StringVar(&run, "run", "", "run id (required)")
	requireFlags(watchdog, "run")
	c.AddCommand(ls, sweep, journal, watchdog)
	return c
}

// sweepRuns plans without the journal and opens it only if there is a
// decision to journal, so a sweep of an empty ledger costs a scan.
func sweepRuns(ctx context.Context, g *globals, exclude, by string) ([]hostledger.Outcome, error) {
	root, err := node.PrepareRoot(g.stateDir)
	if err != nil {
		return nil, err
	}
	dir := hostledger.Dir(root)
	self := ledger.Self{Run: exclude, Driver: driverOf(g)}
	plan, err := hostledger.Plan(dir, self, time.Now())
	if err != nil {
		return nil, err
	}
	if !hostledger.AnySweep(plan) && hostledger.KeptEvents(by, self, time.Now(), hostledger.Outcomes(plan)) == nil {
		return hostledger.Outcomes(plan), nil
	}
	var out []hostledger.Outcome
	err = withManagerOwned(ctx, g, hostledger.AnySweep(plan), func(m *lifecycle.Manager) error {
		var err error
		out, err = hostledger.Apply(ctx, dir, plan, self, by, session.NewSweepActions(m))
		return err
	})
	return out, err
}

// watchdogPatience bounds how long a watchdog waits for a busy journal.
const watchdogPatience = 5 * time.Minute

func watchRun(cmd *cobra.Command, g *globals, run string) error {
	if !ledger.ValidRunID(run) {
		return usageError{fmt.Errorf("--run %q is not a run id", run)}
	}
	// EOF on anything but the owner's pipe (a terminal, /dev/null) would
	// sweep a live run.
	if st, err := os.Stdin.Stat(); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		return usageError{errors.New("ledger watchdog: stdin must be the run owner's pipe")}
	}
	// Blocks until every holder of the write end has closed it: the owner
	// exited (any way) or shut down cleanly.
	io.Copy(io.Discard, os.Stdin)
	root, err := node.PrepareRoot(g.stateDir)
	if err != nil {
		return err
	}
	dir := hostledger.Dir(root)
	if !hostledger.Exists(dir, run) {
		return nil // a clean shutdown left nothing to do
	}
	ctx := context.WithoutCancel(cmd.Context())
	// The owner may have died while one of its own nexus commands holds the
	// journal (a create that goes on to finish): keep waiting for it rather
	// than leave the run to a later sweep.
	deadline := time.Now().Add(watchdogPatience)
	for {
		err = withManagerOwned(ctx, g, true, func(m *lifecycle.Manager) error {
			o, _, err := hostledger.SweepOwn(ctx, dir, run, ledger.Self{Driver: driverOf(g)}, "watchdog", session.NewSweepActions(m))
			fmt.Fprintf(cmd.ErrOrStderr(), "nexus watchdog: run %s: removed %v, not found %v %s%s\n", run, o.Removed, o.NotFound, o.Skipped, o.Error)
			if err == nil && o.Error != "" {
				err = errors.New(o.Error)
			}
			return err
		})
		if !errors.Is(err, control.ErrBusy) || time.Now().After(deadline) {
			return err
		}
	}
}

// plannedOutcomes is each run's verdict and, for a run a sweep would
// remove, the sandboxes it would remove.
func plannedOutcomes(root string, plan []hostledger.Planned) []hostledger.Outcome {
	out := hostledger.Outcomes(plan)
	for i := range out {
		if out[i].Verdict == string(ledger.Sweep) {
			out[i].WouldRemove = hostledger.ListedSandboxes(hostledger.Dir(root), out[i].Run)
		}
	}
	return out
}

// printOutcomes prints one line per run; acted adds what a sweep did.
func printOutcomes(cmd *cobra.Command, o *output, out []hostledger.Outcome, acted bool) error {
	return printList(cmd, o, out, func(o hostledger.Outcome) string { return o.Run }, table[hostledger.Outcome]{
		header: []string{"RUN", "VERDICT", "REASON", "DONE"},
		row: func(o hostledger.Outcome) []string {
			var done []string
			if acted && o.Verdict == string(ledger.Sweep) && o.Skipped == "" {
				done = append(done, fmt.Sprintf("removed %d [%s], not found %d", len(o.Removed), strings.Join(o.Removed, " "), len(o.NotFound)))
			}
			if len(o.WouldRemove) > 0 {
				done = append(done, "would remove "+strings.Join(o.WouldRemove, " "))
			}
			if o.Skipped != "" {
				done = append(done, "skipped: "+o.Skipped)
			}
			if o.Error != "" {
				done = append(done, "error: "+o.Error)
			}
			return []string{o.Run, o.Verdict, o.Reason, strings.Join(done, "; ")}
		},
	})
}
