package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/ledger"
	"github.com/nexus-sandbox/nexus/session"
)

func driverOf(g *globals) string { return config.Driver(g.driver) }

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
	root, err := control.PrepareRoot(g.stateDir)
	if err != nil {
		return 0, err
	}
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	return session.Run(ctx, session.RunOptions{
		Root: root, Driver: g.driver, Keep: keep, Argv: argv, Nexus: exe, Env: os.Environ(),
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
	})
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
				if !layout.ValidRunID(run) {
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
			root, err := control.PrepareRoot(g.stateDir)
			if err != nil {
				return err
			}
			out, err := session.PlanRuns(root, ledger.Self{Driver: driverOf(g)})
			if err != nil {
				return err
			}
			return printOutcomes(cmd, lsOut, out, false)
		}}
	lsOut = addOutput(ls, true)

	var sweepOut *output
	var sweepDry bool
	var exclude string
	sweep := &cobra.Command{Use: "sweep", Short: "Remove the sandboxes and ledgers of dead runs", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sweepDry {
				// What ledger ls shows: each run's verdict, nothing swept.
				root, err := control.PrepareRoot(g.stateDir)
				if err != nil {
					return err
				}
				out, err := session.PlanRuns(root, ledger.Self{Run: exclude, Driver: driverOf(g)})
				if err != nil {
					return err
				}
				return printOutcomes(cmd, sweepOut, out, false)
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
			return withManager(cmd.Context(), g, func(m *session.Manager) error { return session.JournalKept(cmd.Context(), m, evs) })
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

// sweepRuns sweeps the dead runs of the state root, all but exclude.
func sweepRuns(ctx context.Context, g *globals, exclude, by string) ([]ledger.Outcome, error) {
	root, err := control.PrepareRoot(g.stateDir)
	if err != nil {
		return nil, err
	}
	return session.SweepRuns(ctx, root, ledger.Self{Run: exclude, Driver: driverOf(g)}, by, manage(g))
}

// manage is withManagerOwned for the session package.
func manage(g *globals) session.Manage {
	return func(ctx context.Context, owned bool, fn func(*session.Manager) error) error {
		return withManagerOwned(ctx, g, owned, fn)
	}
}

func watchRun(cmd *cobra.Command, g *globals, run string) error {
	if !layout.ValidRunID(run) {
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
	root, err := control.PrepareRoot(g.stateDir)
	if err != nil {
		return err
	}
	return session.SweepWatched(context.WithoutCancel(cmd.Context()), root, run, ledger.Self{Driver: driverOf(g)}, manage(g), cmd.ErrOrStderr())
}

// printOutcomes prints one line per run; acted adds what a sweep did.
func printOutcomes(cmd *cobra.Command, o *output, out []ledger.Outcome, acted bool) error {
	return printList(cmd, o, out, func(o ledger.Outcome) string { return o.Run }, table[ledger.Outcome]{
		header: []string{"RUN", "VERDICT", "REASON", "DONE"},
		row: func(o ledger.Outcome) []string {
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
