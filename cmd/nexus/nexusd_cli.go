//go:build !nexusd

// The CLI (built without -tags nexusd) links no store, journal, daemon or
// fleet adapter: a command that needs one is run by nexusd, the binary
// beside it, with the same arguments (execNexusd). See nexusd.go.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/replay"
	"github.com/nexus-sandbox/nexus/session"
)

// NexusdEnv names the nexusd binary the CLI uses instead of the one beside
// it.
const NexusdEnv = "NEXUS_NEXUSD"

// inProcess: the CLI cannot open the store (control.ErrInProcess).
func inProcess() control.InProcess { return nil }

// daemonBinary is nexusd: $NEXUS_NEXUSD, else beside this executable.
func daemonBinary() (string, error) {
	if p := os.Getenv(NexusdEnv); p != "" {
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), "nexusd")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("nexusd, the daemon's binary, is not beside %s (install both, or set %s): %w", exe, NexusdEnv, err)
	}
	return p, nil
}

// identify makes a daemon of this installation's nexusd the one this
// command's build matches. Without a nexusd the command fails when it
// needs one, saying why.
func identify() {
	if p, err := daemonBinary(); err == nil {
		control.IdentifyAs(p)
	}
}

// The main goroutine, which runs the command and so execNexusd, stays on
// the process's first thread. An exec from another thread makes the
// kernel retire the first one, which reads as a zombie in /proc for a
// moment: a parent watching this process by pid and start time (a
// sandbox's VMM or supervisor started through this binary) would take it
// for dead.
func init() { runtime.LockOSThread() }

// startTracing runs a command whose spans the environment asks to export
// in nexusd, which links the exporter; the CLI does not, so that no other
// command pays for its start-up.
func startTracing(context.Context) (flush func()) {
	if config.TracingRequested() {
		fmt.Fprintf(os.Stderr, "nexus: traces not exported: %v\n", execNexusd())
	}
	return func() {}
}

// execNexusd replaces this process with nexusd, given the same arguments:
// it runs the command in full.
func execNexusd() error {
	p, err := daemonBinary()
	if err != nil {
		return err
	}
	return execAs(p)
}

// execAs replaces this process with the binary at p, given the same
// arguments (the same pid: a parent waiting for the command waits for
// it, and is charged its CPU).
func execAs(p string) error {
	return fmt.Errorf("run %s: %w", p, syscall.Exec(p, append([]string{p}, os.Args[1:]...), os.Environ()))
}

// inNexusd runs the command in nexusd when err says it needs the store in
// its own process.
func inNexusd(err error) error {
	if errors.Is(err, control.ErrInProcess) {
		return execNexusd()
	}
	return err
}

func journalHint(error) string { return "" }

func runDaemon(*cobra.Command, *globals, *daemonFlags) error { return execNexusd() }

func repairJournal(*cobra.Command, *globals, string, *output) error { return execNexusd() }

func fleetTemplate(*cobra.Command, []string, templateFlags, string, string) error {
	return execNexusd()
}

func fleetAggregate(*cobra.Command, *fleetConn, []string, int, bool) error { return execNexusd() }

func eachRecord(context.Context, *globals, *replayFlags, func(replay.Record)) error {
	return execNexusd()
}

func readJournal(context.Context, *globals, *replayFlags) ([]replay.Record, error) {
	return nil, execNexusd()
}

func diffRoot(string, []replay.Record) (replay.Divergence, error) {
	return replay.Divergence{}, execNexusd()
}

func buildInitramfs(*cobra.Command, string, initramfsFlags) error { return execNexusd() }

func writeManPages(*cobra.Command, string) error { return execNexusd() }

// The sandboxes' processes (hidden_nexusd.go) run from nexusd: their
// names here hand a command line given to the CLI over to it.
func shimCmds() []*cobra.Command {
	var cmds []*cobra.Command
	for _, use := range session.ShimCommands() {
		cmds = append(cmds, &cobra.Command{Use: use, Hidden: true, DisableFlagParsing: true,
			RunE: func(*cobra.Command, []string) error { return execNexusd() }})
	}
	return cmds
}
