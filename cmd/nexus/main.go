// Command nexus manages the lifecycle of microVM sandboxes and every host
// resource they leave behind. This file parses and maps errors to exit
// codes; the work lives in the packages it calls.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/oneline"
)

// usageError marks bad input: exit 2, not 1.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// exitStatus is an exit status chosen by a command with nothing more to
// say: `run` exits with its command's status (after its cleanup).
type exitStatus struct{ code int }

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", e.code) }

type globals struct {
	stateDir string
	driver   string
	// askedDriver is --driver when given on the command line: a sandbox
	// recorded with another driver is refused, not booted under it.
	askedDriver string
	wait        bool
	// readsConfig is set for the commands that read config settings:
	// only they are refused by a config file nexus cannot use.
	readsConfig bool
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
	watchInterrupt(ctx)
	identify()
	flush := startTracing(ctx)
	err := execute(ctx, newRootFor(os.Args[1:]), os.Args[1:])
	flush()
	os.Exit(exitCode(err))
}

// execute runs the command line. cobra reports an unknown command as an
// untyped error, before any command runs; looking the line up first, the
// way Execute will, types that error as bad input (exit 2).
func execute(ctx context.Context, root *cobra.Command, args []string) error {
	root.SetArgs(args)
	// Execute adds the shell-completion request command before its own
	// lookup, and nothing outside cobra can: a completion request is left
	// to it.
	if !slices.Contains(args, cobra.ShellCompRequestCmd) && !slices.Contains(args, cobra.ShellCompNoDescRequestCmd) {
		// Execute adds these before its own lookup too; both are idempotent.
		root.InitDefaultHelpCmd()
		root.InitDefaultCompletionCmd(args...)
		if _, _, err := root.Find(args); err != nil {
			return usageError{err}
		}
	}
	return root.ExecuteContext(ctx)
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if es := (exitStatus{}); errors.As(err, &es) {
		return es.code // a command's own status (run's child, exec's guest command)
	}
	msg := err.Error()
	msg += journalHint(err)
	fmt.Fprintf(os.Stderr, "nexus: %s\n", oneline.Of(msg))
	if errors.Is(err, errInterrupted) || interrupted.Load() {
		return 130
	}
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

// topCommand is a command of the root: the name and aliases a command
// line picks it by, and how it is built.
type topCommand struct {
	names []string // the command's name, then its aliases
	build func(*globals) *cobra.Command
}

// command builds t's command, its aliases set from the table.
func (t *topCommand) command(g *globals) *cobra.Command {
	c := t.build(g)
	c.Aliases = t.names[1:]
	return c
}

// topCommands are the root's commands but the hidden ones (shimCmds,
// testCommands) and docs; a test holds the names to the built commands.
var topCommands = []topCommand{
	{[]string{"version"}, func(*globals) *cobra.Command { return versionCmd() }},
	{[]string{"daemon"}, daemonCmd},
	{[]string{"events"}, eventsCmd},
	{[]string{"ls", "ps", "list"}, lsCmd},
	{[]string{"inspect"}, inspectCmd},
	{[]string{"create"}, createCmd},
	{[]string{"fork"}, forkCmd},
	{[]string{"snapshot"}, snapshotCmd},
	{[]string{"restore"}, restoreCmd},
	{[]string{"rename"}, renameCmd},
	{[]string{"start"}, startCmd},
	{[]string{"stop"}, stopCmd},
	{[]string{"wait"}, waitCmd},
	{[]string{"rm", "remove", "delete"}, rmCmd},
	{[]string{"recover"}, recoverCmd},
	{[]string{"volume"}, volumeCmd},
	{[]string{"replay"}, replayCmd},
	{[]string{"image-cache"}, imageCacheCmd},
	{[]string{"reap"}, reapCmd},
	{[]string{"run"}, runCmd},
	{[]string{"ledger"}, ledgerCmd},
	{[]string{"journal"}, journalCmd},
	{[]string{"config"}, configCmd},
	{[]string{"logs"}, logsCmd},
	{[]string{"fleet"}, fleetCmd},
	{[]string{"guest"}, func(*globals) *cobra.Command { return guestCmd() }},
	{[]string{"exec"}, execCmd},
	{[]string{"cp"}, cpCmd},
}

// newRoot builds the whole command tree.
func newRoot() *cobra.Command { return newRootOf(nil) }

// newRootFor builds the tree a command line runs: the root and the one
// command of topCommands the line names, so that no command pays for
// building every other command and its flags. A line naming none of them
// (help, a completion request, a hidden command, a typo) gets the whole
// tree, and with it cobra's help, suggestions and errors.
func newRootFor(args []string) *cobra.Command {
	// A line that starts with a command's name or alias (the usual one)
	// names that command.
	if len(args) > 0 {
		for i := range topCommands {
			if t := &topCommands[i]; slices.Contains(t.names, args[0]) {
				if root := newRootOf(t); runsOne(root, args) {
					return root
				}
				break
			}
		}
	}
	// Otherwise which command the line names, by cobra's own lookup over
	// the root's flags and a stand-in for each command.
	lookup := newRootOf(&topCommand{})
	stand := map[*cobra.Command]*topCommand{}
	for i := range topCommands {
		t := &topCommands[i]
		c := &cobra.Command{Use: t.names[0], Aliases: t.names[1:], Run: func(*cobra.Command, []string) {}}
		stand[c] = t
		lookup.AddCommand(c)
	}
	c, _, err := lookup.Find(args)
	for err == nil && c.HasParent() && c.Parent() != lookup {
		c = c.Parent()
	}
	if t := stand[c]; err == nil && t != nil {
		if root := newRootOf(t); runsOne(root, args) {
			return root
		}
	}
	return newRootOf(nil)
}

// runsOne says whether args run a command of root, which holds one.
func runsOne(root *cobra.Command, args []string) bool {
	c, _, err := root.Find(args)
	return err == nil && c != root
}

// newRootOf builds the root with one command of topCommands (none when it
// builds nothing), or with every command when only is nil.
func newRootOf(only *topCommand) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "nexus",
		Short:         "Lifecycle manager for microVM sandboxes and the host resources they own",
		SilenceErrors: true,
		SilenceUsage:  true,
		// Any text turns on --version; the template prints the full line,
		// read only when asked (it opens nexusd's file).
		Version: "nexus",
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if g.driver != "" {
				if err := config.CheckDriver(g.driver); err != nil {
					return usageError{fmt.Errorf("--driver %q: %v", g.driver, err)}
				}
			}
			if cmd.Flags().Changed("driver") {
				g.askedDriver = g.driver
			}
			g.readsConfig = configReaders[strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")]
			return nil
		},
	}
	addTemplateFuncs()
	root.SetVersionTemplate("{{nexusVersion}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", defaultStateDir(), "state root (env NEXUS_STATE_DIR)")
	root.PersistentFlags().BoolVar(&g.wait, "wait", false, "wait for another command's saga on the same sandbox or volume to end instead of refusing")
	root.PersistentFlags().StringVar(&g.driver, "driver", os.Getenv("NEXUS_DRIVER"), "VMM driver: "+config.OneOf(config.Drivers)+" (env NEXUS_DRIVER)")
	switch {
	case only == nil:
		for i := range topCommands {
			root.AddCommand(topCommands[i].command(g))
		}
		root.AddCommand(shimCmds()...)
		root.AddCommand(testCommands(g)...)
		root.AddCommand(docsCmd())
	case only.build != nil:
		root.AddCommand(only.command(g))
		// The completion command is asked for by name, and a line naming
		// it builds the whole tree.
		root.CompletionOptions.DisableDefaultCmd = true
	}
	root.SetHelpCommand(helpCmd())
	addExamples(root)
	addCompletions(root, g)
	return root
}

// addTemplateFuncs registers, once per process, the functions the
// templates call: cobra keeps them in one global map.
var addTemplateFuncs = sync.OnceFunc(func() {
	cobra.AddTemplateFunc("nexusVersion", func() string { return readVersion().String() })
})

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

// exactArgs, minArgs, maxArgs and noArgs are cobra's argument checks
// reporting a usage error (exit 2) that carries the command's usage line.
func exactArgs(n int) cobra.PositionalArgs { return argsUsage(cobra.ExactArgs(n)) }
func minArgs(n int) cobra.PositionalArgs   { return argsUsage(cobra.MinimumNArgs(n)) }
func maxArgs(n int) cobra.PositionalArgs   { return argsUsage(cobra.MaximumNArgs(n)) }

func noArgs(cmd *cobra.Command, args []string) error { return argsUsage(cobra.NoArgs)(cmd, args) }

func argsUsage(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{fmt.Errorf("%w; usage: %s (see `%s --help`)", err, cmd.UseLine(), cmd.CommandPath())}
		}
		return nil
	}
}

// requireFlags refuses the command, as a usage error (exit 2), when one of
// the named flags was not given. cobra's own MarkFlagRequired check runs
// before any hook and returns an untyped error, which would exit 1.
func requireFlags(c *cobra.Command, names ...string) {
	next := c.PreRunE
	c.PreRunE = func(cmd *cobra.Command, args []string) error {
		for _, n := range names {
			if !cmd.Flags().Changed(n) {
				return usageError{fmt.Errorf("required flag --%s not set", n)}
			}
		}
		if next != nil {
			return next(cmd, args)
		}
		return nil
	}
}

// helpCmd is cobra's help command, except that an unknown topic is a usage
// error (exit 2) rather than a help page and exit 0.
func helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "help [command]",
		Short:   "Help about any command",
		Example: "  nexus help create", // cobra adds this command at Execute, after addExamples
		RunE: func(c *cobra.Command, args []string) error {
			target, rest, err := c.Root().Find(args)
			if err != nil || target == nil || len(rest) > 0 && len(args) > 0 {
				return usageError{fmt.Errorf("unknown help topic %q", strings.Join(args, " "))}
			}
			target.InitDefaultHelpFlag()
			target.InitDefaultVersionFlag()
			return target.Help()
		},
	}
}

func versionCmd() *cobra.Command {
	var o *output
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the nexus version, the revision it was built from, and its Go and nats-server versions",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := readVersion()
			return printValue(cmd, o, v, nil, func(w io.Writer) { fmt.Fprintln(w, v.String()) })
		},
	}
	o = addOutput(c, false)
	return c
}
