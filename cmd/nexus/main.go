// Command nexus manages the lifecycle of microVM sandboxes and every host
// resource they leave behind. This file parses and maps errors to exit
// codes; the work lives in the packages it calls.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// usageError marks bad input: exit 2, not 1.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

type globals struct {
	stateDir string
	driver   string
	wait     bool
}

// errInterrupted is the cause of the context a first SIGINT or SIGTERM
// cancels: no new saga step starts, and compensation runs to the end under
// a context of its own. A second signal aborts at once; the saga stays open
// under its (then released) runner lease for `nexus recover`.
var errInterrupted = errors.New("interrupted")

// interrupted is set by the first signal: a command that then fails failed
// because of it (a step may see only context.Canceled), so it exits 130.
var interrupted atomic.Bool

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		interrupted.Store(true)
		cancel(fmt.Errorf("%w by %s", errInterrupted, s))
		<-sigs
		fmt.Fprintln(os.Stderr, "nexus: aborted; anything this command left unfinished is finished by `nexus recover`")
		os.Exit(130)
	}()
	err := newRoot().ExecuteContext(ctx)
	os.Exit(exitCode(err))
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	fmt.Fprintf(os.Stderr, "nexus: %s\n", oneLine(err.Error()))
	if errors.Is(err, errInterrupted) || interrupted.Load() {
		return 130
	}
	var u usageError
	// cobra reports unknown subcommands as plain errors; they are usage errors too.
	if errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command") {
		return 2
	}
	return 1
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "nexus",
		Short:         "Lifecycle manager for microVM sandboxes and the host resources they own",
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if g.driver != "" && g.driver != "cloud-hypervisor" && g.driver != "process" {
				return usageError{fmt.Errorf("--driver %q: want cloud-hypervisor or process", g.driver)}
			}
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", defaultStateDir(), "state root (env NEXUS_STATE_DIR)")
	root.PersistentFlags().BoolVar(&g.wait, "wait", false, "wait for another command's saga on the same sandbox or volume to end instead of refusing")
	root.PersistentFlags().StringVar(&g.driver, "driver", os.Getenv("NEXUS_DRIVER"), "VMM driver: cloud-hypervisor or process (env NEXUS_DRIVER)")
	root.AddCommand(
		versionCmd(),
		daemonCmd(g),
		eventsCmd(g),
		lsCmd(g),
		inspectCmd(g),
		demoCmd(g),
		createCmd(g), forkCmd(g), snapshotCmd(g), restoreCmd(g), startCmd(g), stopCmd(g),
		rmCmd(g), recoverCmd(g), volumeCmd(g), replayCmd(g), vmmProcessCmd(), supervisorCmd(),
		imageCacheCmd(g), reapCmd(g), runCmd(g), ledgerCmd(g),
	)
	return root
}

// defaultStateDir follows NEXUS_STATE_DIR, then the XDG state directory.
func defaultStateDir() string {
	if d := os.Getenv("NEXUS_STATE_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "nexus")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "nexus")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("nexus-%d", os.Getuid()))
}

// exactArgs is cobra.ExactArgs reporting a usage error.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

func noArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.NoArgs(cmd, args); err != nil {
		return usageError{err}
	}
	return nil
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the nexus version",
		Args:  noArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "nexus %s\n", version)
		},
	}
}
