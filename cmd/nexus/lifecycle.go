package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dustin/go-humanize/english"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/oneline"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/session"
)

// withManager connects to the state root and builds the lifecycle manager
// for the chosen driver.
func withManager(ctx context.Context, g *globals, fn func(*session.Manager) error) error {
	return withManagerOwned(ctx, g, false, fn)
}

// withManagerOwned with owned set is for the commands whose safety rests on
// owning the journal: while they own it, no other command runs a saga, so
// every open saga's runner is dead (a ledger sweep that removes, whose
// finishStranded recovers only then). recover needs no such thing: it
// leaves alone every saga whose runner lease is held.
func withManagerOwned(ctx context.Context, g *globals, owned bool, fn func(*session.Manager) error) error {
	build, err := managerFor(g)
	if err != nil {
		return err
	}
	return withBackendOwned(ctx, g, owned, func(b control.Backend) error {
		m, err := build(b)
		if err != nil {
			return err
		}
		return fn(m)
	})
}

// managerFor reads what a lifecycle manager needs (root, config, driver)
// and returns how to build one over a backend.
func managerFor(g *globals) (func(control.Backend) (*session.Manager, error), error) {
	root, err := control.PrepareRoot(g.stateDir)
	if err != nil {
		return nil, err
	}
	exe, err := shimBinary()
	if err != nil {
		return nil, err
	}
	cfg, err := loadConfig(root)
	if err != nil {
		if g.readsConfig {
			return nil, err
		}
		cfg = config.File{} // this command reads no setting: defaults are never used
	}
	warn := onceEach(func(msg string) {
		if msg == session.HostGuestNotice && !isTerminal(os.Stderr) {
			// A person's reminder: a script keeps its one-line errors
			// and exec's stderr holds only the guest command's.
			return
		}
		fmt.Fprintf(os.Stderr, "nexus: warning: %s\n", oneline.Of(msg))
	})
	return func(b control.Backend) (*session.Manager, error) {
		return session.NewManager(failAppends(b), session.Settings{
			Root: root, Driver: driverName(g, cfg), Shim: exe, AskedDriver: g.askedDriver, Config: cfg,
			Hook: testHooks(), Wait: g.wait, Progress: progressFor(), Notice: warn,
			Status: func(msg string) { fmt.Fprintf(os.Stderr, "nexus: %s\n", oneline.Of(msg)) },
		})
	}, nil
}

// onceEach calls say once per distinct message: a command that boots or
// reaches several sandboxes tells a notice that concerns them all once.
func onceEach(say func(string)) func(string) {
	var mu sync.Mutex
	said := map[string]bool{}
	return func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		if !said[msg] {
			said[msg] = true
			say(msg)
		}
	}
}

// printResult prints one command's result through the output layer; ids
// is what -q prints (nil for a command without -q).
func printResult(cmd *cobra.Command, o *output, v any, ids func() []string, human func()) error {
	return printValue(cmd, o, v, ids, func(io.Writer) { human() })
}

func sandboxIDs(list ...projections.Sandbox) func() []string {
	return func() []string {
		ids := make([]string, len(list))
		for i, sb := range list {
			ids[i] = sb.ID
		}
		return ids
	}
}

func sandboxLine(cmd *cobra.Command, sb projections.Sandbox) {
	fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\t%s\n", sb.ID, sb.State, dash(sb.Handle))
}

// addLabelFlag adds the repeatable --label KEY=VALUE of a command that
// makes something labelled (what).
func addLabelFlag(c *cobra.Command, to *[]string, what string) {
	c.Flags().StringArrayVar(to, "label", nil, "KEY=VALUE: a label of "+what+" (repeatable)")
}

// parseLabels reads --label flags; a bad one is a usage error.
func parseLabels(flags []string) (events.Labels, error) {
	labels, err := projections.ParseLabels(flags)
	if err != nil {
		return nil, usageError{fmt.Errorf("--%w", err)}
	}
	return labels, nil
}

func createCmd(g *globals) *cobra.Command {
	var ready *readyWait
	var spec session.CreateSpec
	var shadows, volumes, labels []string
	var journalKeptIn bool
	var memory string
	var o *output
	c := &cobra.Command{
		Use:   "create --image IMG",
		Short: "Create and boot a sandbox",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range shadows {
				name, src, ok := strings.Cut(s, "=")
				if !ok || name == "" || src == "" {
					return usageError{fmt.Errorf("--shadow %q: want NAME=SRC", s)}
				}
				spec.Shadows = append(spec.Shadows, session.Shadow{Name: name, Source: src})
			}
			for _, v := range volumes {
				name, guest, ok := strings.Cut(v, ":")
				if !ok || name == "" || guest == "" {
					return usageError{fmt.Errorf("--volume %q: want NAME:GUESTPATH", v)}
				}
				spec.Volumes = append(spec.Volumes, session.Mount{Name: name, GuestPath: guest})
			}
			if spec.Image == "" {
				return usageError{fmt.Errorf("--image is required")}
			}
			var err error
			if spec.Labels, err = parseLabels(labels); err != nil {
				return err
			}
			if cmd.Flags().Changed("cpus") && spec.Cpus < 1 {
				return usageError{fmt.Errorf("--cpus %d: want at least 1", spec.Cpus)}
			}
			if memory != "" {
				n, err := config.ParseSize(memory)
				if err != nil {
					return usageError{fmt.Errorf("--memory %q: %v", memory, err)}
				}
				spec.MemoryBytes = n
			}
			var kept []events.RunKeptEvent
			if journalKeptIn {
				if kept, err = readKept(cmd.InOrStdin()); err != nil {
					return err
				}
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				// The client's init-time sweep ran before this, its first
				// create: its decisions go in first.
				if err := session.JournalKept(cmd.Context(), m, kept); err != nil {
					return err
				}
				if err := session.BindToRun(m, os.Getenv(client.EnvRunID), &spec); err != nil {
					return err
				}
				var err error
				if spec.Cpus, spec.MemoryBytes, err = m.Sizing(spec.Cpus, spec.MemoryBytes); err != nil {
					return usageError{err}
				}
				sb, err := m.Create(cmd.Context(), spec)
				if err != nil {
					return err
				}
				// A sandbox that is not Ready in time is kept, and printed.
				sb, werr := ready.await(cmd.Context(), m, sb)
				if err := printResult(cmd, o, sandboxJSON(sb), sandboxIDs(sb), func() { sandboxLine(cmd, sb) }); err != nil {
					return err
				}
				return werr
			})
		},
	}
	ready = addReadyFlags(c)
	c.Flags().StringVar(&spec.Image, "image", "", "OS disk image to copy (a regular file)")
	c.Flags().StringVar(&spec.Handle, "handle", "", "human handle for the sandbox (unique)")
	c.Flags().StringVar(&spec.Workspace, "workspace", "", "directory to build the workspace disk from")
	c.Flags().StringArrayVar(&shadows, "shadow", nil, "NAME=SRC: a per-sandbox copy of SRC (needs --handle)")
	c.Flags().StringArrayVar(&volumes, "volume", nil, "NAME:GUESTPATH: attach a named volume")
	addLabelFlag(c, &labels, "the sandbox")
	c.Flags().BoolVar(&spec.Force, "force", false, "skip the disk-space preflight")
	c.Flags().IntVar(&spec.Cpus, "cpus", 0, "vCPUs (default [vm] cpus, else 1; at most the host's CPUs)")
	c.Flags().StringVar(&memory, "memory", "", "guest memory, e.g. 1G or 768M (default [vm] memory, else 512M; at most the host's)")
	o = addOutput(c, true)
	c.Flags().BoolVar(&journalKeptIn, "journal-kept", false, "first journal the run.kept events (a JSON array) on stdin")
	c.Flags().MarkHidden("journal-kept")
	return c
}

func forkCmd(g *globals) *cobra.Command {
	var ready *readyWait
	spec := session.ForkSpec{Count: 1}
	var labels []string
	var o *output
	var freezeTimeout time.Duration
	c := &cobra.Command{
		Use:   "fork ID",
		Short: "Fork a sandbox into new children",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec.Parent = args[0]
			if err := session.CheckForkCount(spec.Count); err != nil {
				return usageError{err}
			}
			if _, err := session.ChildHandles(spec.Handle, spec.Count); err != nil {
				return usageError{err}
			}
			var err error
			if spec.Labels, err = parseLabels(labels); err != nil {
				return err
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				m.FreezeDeadline = freezeTimeout
				children, err := m.Fork(cmd.Context(), spec)
				if err != nil && len(children) == 0 {
					return err
				}
				var werr error
				for i := range children {
					var e error
					children[i], e = ready.await(cmd.Context(), m, children[i])
					werr = errors.Join(werr, e)
				}
				// Children made before a failure or an interruption are
				// committed and kept: say which, then why the rest are not.
				if perr := printResult(cmd, o, sandboxesJSON(children), sandboxIDs(children...), func() {
					for _, sb := range children {
						sandboxLine(cmd, sb)
					}
				}); perr != nil {
					return perr
				}
				if err != nil {
					return errors.Join(fmt.Errorf("%d of %d children made and kept (printed above); the next was not: %w", len(children), spec.Count, err), werr)
				}
				return werr
			})
		},
	}
	ready = addReadyFlags(c)
	c.Flags().IntVar(&spec.Count, "count", 1, "number of children")
	c.Flags().StringVar(&spec.Handle, "handle", "", "handle of the child, or of each child with {n} for its number 1..count (web/{n}); unique")
	c.Flags().BoolVar(&spec.Force, "force", false, "skip the disk-space preflight")
	addLabelFlag(c, &labels, "every child (not inherited from the parent)")
	c.Flags().BoolVar(&spec.ReadOnlyVolumes, "readonly-volumes", false, "attach the parent's named volumes read-only to the children")
	o = addOutput(c, true)
	c.Flags().BoolVar(&spec.CrashConsistent, "crash-consistent", false, "fork a running parent whose guest agent does not freeze its filesystems anyway (children get what a power cut would leave)")
	c.Flags().DurationVar(&freezeTimeout, "freeze-timeout", session.DefaultFlushDeadline, "how long to wait for a running parent's guest agent to freeze its filesystems")
	return c
}

// eachRef runs fn on every reference in turn. Like docker, one that fails
// is reported on stderr and the rest are still done; the command then
// fails. A single reference fails with its own error, as before.
func eachRef(cmd *cobra.Command, refs []string, fn func(ref string) error) error {
	if len(refs) == 1 {
		return fn(refs[0])
	}
	failed := 0
	for _, ref := range refs {
		err := fn(ref)
		if err == nil {
			continue
		}
		if cmd.Context().Err() != nil {
			return err // interrupted: do no more
		}
		failed++
		fmt.Fprintf(cmd.ErrOrStderr(), "nexus: %s: %s\n", ref, oneline.Of(err.Error()))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d failed", failed, len(refs))
	}
	return nil
}

// printEach prints what eachRef produced: with --json one object for one
// reference and an array for several; with --format or -q each item;
// else nothing (each line was printed as it came).
func printEach[T any](cmd *cobra.Command, o *output, refs []string, done []T, id func(T) string) error {
	switch {
	case o.human():
		return nil
	case o.json && len(refs) == 1:
		if len(done) == 0 {
			return nil
		}
		return printJSON(cmd.OutOrStdout(), done[0])
	}
	return printList(cmd, o, done, id, table[T]{})
}

// simpleCmd is a command taking sandbox references and printing each.
// A sandbox already in the state the command wants is reported and
// succeeds (client.ErrAlready).
func simpleCmd(g *globals, use, short string, run func(context.Context, *session.Manager, string) (projections.Sandbox, error)) *cobra.Command {
	var o *output
	c := &cobra.Command{
		Use: use + " ID...", Short: short, Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				var done []projections.Sandbox
				err := eachRef(cmd, args, func(ref string) error {
					sb, err := run(cmd.Context(), m, ref)
					var already *session.Already
					if errors.As(err, &already) {
						if o.human() {
							fmt.Fprintf(cmd.OutOrStdout(), "%s already %s\n", sb.ID, already.State)
						}
						err = nil
					} else if err == nil && o.human() {
						sandboxLine(cmd, sb)
					}
					if err == nil {
						done = append(done, sb)
					}
					return err
				})
				return errors.Join(err, printEach(cmd, o, args, sandboxesJSON(done), sandboxID))
			})
		},
	}
	o = addOutput(c, true)
	return c
}

func startCmd(g *globals) *cobra.Command {
	var opt session.StartOptions
	var ready *readyWait
	c := simpleCmd(g, "start", "Boot stopped sandboxes (a running one is reported and left alone)", func(ctx context.Context, m *session.Manager, ref string) (projections.Sandbox, error) {
		sb, err := m.StartWith(ctx, ref, opt)
		if err != nil {
			return sb, err
		}
		return ready.await(ctx, m, sb)
	})
	ready = addReadyFlags(c)
	c.Flags().BoolVar(&opt.AcceptUnflushed, "accept-unflushed", false, "prepare an overlay whose last run has no flush acknowledgement (replay its journal on a private copy, publish only after the checks)")
	return c
}

func stopCmd(g *globals) *cobra.Command {
	var deadline time.Duration
	c := simpleCmd(g, "stop", "Stop running sandboxes (a stopped one is reported and left alone)", func(ctx context.Context, m *session.Manager, ref string) (projections.Sandbox, error) {
		m.FlushDeadline = deadline
		return m.Stop(ctx, ref)
	})
	c.Flags().DurationVar(&deadline, "flush-timeout", session.DefaultFlushDeadline, "how long to wait for the guest agent's flush; without one the run stays unacknowledged")
	return c
}

func rmCmd(g *globals) *cobra.Command {
	var opt session.RemoveOptions
	var dryRun bool
	var o *output
	c := &cobra.Command{
		Use: "rm ID...", Short: "Remove sandboxes and every resource they own (never their volumes' files)", Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				var done []session.Removed
				err := eachRef(cmd, args, func(ref string) error {
					if dryRun {
						rm, paths, err := m.RemovePlan(cmd.Context(), ref, opt)
						if err == nil {
							done = append(done, rm)
							if o.human() {
								w := cmd.OutOrStdout()
								fmt.Fprintf(w, "would remove %s (%s): %s, %s, %s\n", rm.ID, dash(rm.Handle), english.Plural(rm.Resources, "resource", ""), english.Plural(len(rm.Snapshots), "snapshot", ""), formatSize(rm.AllocatedBytes))
								for _, p := range paths {
									fmt.Fprintf(w, "  %s\n", p)
								}
								for _, s := range rm.Snapshots {
									fmt.Fprintf(w, "  snapshot %s\n", s)
								}
							}
						}
						return err
					}
					rm, err := session.RemoveBound(cmd.Context(), m, os.Getenv(client.EnvRunID), ref, opt)
					if err == nil {
						done = append(done, rm)
						if o.human() {
							fmt.Fprintf(cmd.OutOrStdout(), "removed %s (%s): %s, %s, %s\n", rm.ID, dash(rm.Handle), english.Plural(rm.Resources, "resource", ""), english.Plural(len(rm.Snapshots), "snapshot", ""), formatSize(rm.AllocatedBytes))
						}
					}
					return err
				})
				return errors.Join(err, printEach(cmd, o, args, done, func(r session.Removed) string { return r.ID }))
			})
		},
	}
	c.Flags().BoolVarP(&opt.Force, "force", "f", false, "stop a running sandbox first")
	c.Flags().BoolVar(&opt.WithSnapshots, "with-snapshots", false, "also delete the sandbox's snapshots")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be removed (or why it would be refused); change nothing")
	o = addOutput(c, true)
	return c
}

func snapshotCmd(g *globals) *cobra.Command {
	var o *output
	var opt session.SnapshotOptions
	var freezeTimeout time.Duration
	c := &cobra.Command{
		Use: "snapshot ID", Short: "Snapshot a sandbox (disks, and VM state when running); ls and rm manage snapshots", Args: snapshotArgs,
		SuggestionsMinimumDistance: 2,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				m.FreezeDeadline = freezeTimeout
				snap, err := m.SnapshotWith(cmd.Context(), args[0], opt)
				if suggest := cmd.SuggestionsFor(args[0]); errors.Is(err, client.ErrNotFound) && len(suggest) > 0 {
					for i, v := range suggest {
						suggest[i] = "`" + cmd.CommandPath() + " " + v + "`"
					}
					return fmt.Errorf("%w (did you mean %s?)", err, config.OneOf(suggest))
				}
				if err != nil {
					return err
				}
				return printResult(cmd, o, snapshotTaken{snap}, func() []string { return []string{snap} }, func() { fmt.Fprintln(cmd.OutOrStdout(), snap) })
			})
		},
	}
	o = addOutput(c, true)
	c.Flags().BoolVar(&opt.CrashConsistent, "crash-consistent", false, "snapshot a running sandbox whose guest agent does not freeze its filesystems anyway (its disks hold what a power cut would leave)")
	c.Flags().DurationVar(&freezeTimeout, "freeze-timeout", session.DefaultFlushDeadline, "how long to wait for a running sandbox's guest agent to freeze its filesystems")
	c.AddCommand(snapshotLsCmd(g), snapshotRmCmd(g))
	return c
}

// snapshotArgs takes one sandbox. Two words starting with a verb of
// another tool (`snapshot create X`) are refused with the one this takes.
func snapshotArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 2 && slices.Contains([]string{"create", "take", "new", "save"}, args[0]) {
		return usageError{fmt.Errorf("there is no `%s %s`: `%s %s` snapshots a sandbox", cmd.CommandPath(), args[0], cmd.CommandPath(), args[1])}
	}
	return exactArgs(1)(cmd, args)
}

// snapshotTaken is what `snapshot ID --json` prints.
type snapshotTaken struct {
	Snapshot string `json:"snapshot"`
}

func snapshotLsCmd(g *globals) *cobra.Command {
	var o *output
	var filterFlags []string
	c := &cobra.Command{
		Use: "ls [ID]", Short: "List snapshots, of every sandbox or of one", Args: maxArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			filters, err := parseFilters(filterFlags, projections.SnapshotFilters)
			if err != nil {
				return err
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				snaps, err := m.Snapshots(cmd.Context(), strings.Join(args, ""))
				if err != nil {
					return err
				}
				snaps = slices.DeleteFunc(snaps, func(s session.SnapshotInfo) bool {
					return !filters.Match(projections.Facts{Handle: s.Handle, Labels: s.Labels})
				})
				return printList(cmd, o, snaps, func(s session.SnapshotInfo) string { return s.ID }, snapshotTable(o))
			})
		},
	}
	o = addOutput(c, true)
	addFilterFlag(c, &filterFlags, projections.SnapshotFilters)
	addNoTrunc(c, o)
	return c
}

func snapshotTable(o *output) table[session.SnapshotInfo] {
	return table[session.SnapshotInfo]{
		header: []string{"SNAPSHOT", "SANDBOX", "HANDLE", "CREATED", "SIZE"},
		row: func(s session.SnapshotInfo) []string {
			return []string{o.id(s.ID), o.id(s.Sandbox), s.Handle, age(s.CreatedAt), formatSize(s.AllocatedBytes)}
		},
		labels: func(s session.SnapshotInfo) events.Labels { return s.Labels },
	}
}

func snapshotRmCmd(g *globals) *cobra.Command {
	var dryRun bool
	var o *output
	c := &cobra.Command{
		Use: "rm SNAPSHOT...", Short: "Delete snapshots (an ID or a unique prefix of one)", Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				var done []session.SnapshotInfo
				remove, verb := m.SnapshotRemove, "removed"
				if dryRun {
					remove, verb = m.SnapshotRemovePlan, "would remove"
				}
				err := eachRef(cmd, args, func(ref string) error {
					s, err := remove(cmd.Context(), ref)
					if err == nil {
						done = append(done, s)
						if o.human() {
							fmt.Fprintf(cmd.OutOrStdout(), "%s snapshot %s of %s: %s\n", verb, s.ID, s.Sandbox, formatSize(s.AllocatedBytes))
						}
					}
					return err
				})
				return errors.Join(err, printEach(cmd, o, args, done, func(s session.SnapshotInfo) string { return s.ID }))
			})
		},
	}
	c.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be removed; change nothing")
	o = addOutput(c, true)
	return c
}

func restoreCmd(g *globals) *cobra.Command {
	var ready *readyWait
	var force bool
	var handle string
	var labels []string
	var o *output
	c := &cobra.Command{
		Use: "restore SNAPSHOT", Short: "Create a new sandbox from a snapshot", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			parsed, err := parseLabels(labels)
			if err != nil {
				return err
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				sb, err := m.Restore(cmd.Context(), args[0], session.RestoreOptions{Force: force, Handle: handle, Labels: parsed})
				if err != nil {
					return err
				}
				sb, werr := ready.await(cmd.Context(), m, sb)
				if err := printResult(cmd, o, sandboxJSON(sb), sandboxIDs(sb), func() { sandboxLine(cmd, sb) }); err != nil {
					return err
				}
				return werr
			})
		},
	}
	ready = addReadyFlags(c)
	c.Flags().BoolVar(&force, "force", false, "skip the disk-space preflight")
	c.Flags().StringVar(&handle, "handle", "", "human handle for the new sandbox (unique)")
	addLabelFlag(c, &labels, "the new sandbox (not the snapshotted sandbox's)")
	o = addOutput(c, true)
	return c
}

func renameCmd(g *globals) *cobra.Command {
	var o *output
	c := &cobra.Command{
		Use: "rename ID NEW", Short: "Give a sandbox a new handle (unique; its old one is free after)", Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[1] == "" {
				return usageError{errors.New("rename needs a new handle")}
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				sb, err := m.Rename(cmd.Context(), args[0], args[1])
				if err != nil {
					return err
				}
				return printResult(cmd, o, sandboxJSON(sb), sandboxIDs(sb), func() { sandboxLine(cmd, sb) })
			})
		},
	}
	o = addOutput(c, true)
	return c
}

func recoverCmd(g *globals) *cobra.Command {
	var o *output
	c := &cobra.Command{
		Use: "recover", Short: "Resume or compensate unfinished sagas; reconcile sandboxes with their processes", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				rep, err := m.Recover(cmd.Context())
				if err != nil {
					return err
				}
				return printValue(cmd, o, rep, nil, func(w io.Writer) {
					fmt.Fprintf(w, "sagas: %d compensated, %d resumed, %d in flight\n", len(rep.Compensated), len(rep.Resumed), len(rep.InFlight))
					fmt.Fprintf(w, "sandboxes: %d stopped (VMM gone), %d supervisors restarted, %d orphaned supervisors killed, %d VMs unpaused\n",
						len(rep.Stopped), len(rep.Restarted), len(rep.Killed), len(rep.Unpaused))
					fmt.Fprintf(w, "intents without a saga cleaned: %d\n", len(rep.Intents))
					for _, sk := range rep.Skipped {
						what := "sandbox " + sk.Sandbox
						if sk.Saga != "" {
							what = fmt.Sprintf("%s saga %s of %s", sk.Kind, sk.Saga, sk.Sandbox)
						}
						fmt.Fprintf(w, "skipped %s: %s\n", what, sk.Reason)
					}
				})
			})
		},
	}
	o = addOutput(c, false)
	return c
}

func volumeCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "volume", Short: "Manage named volumes (user-owned; never reaped)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{fmt.Errorf("volume needs a subcommand: create, ls, rm, prune")}
		}}
	var size string
	var volLabels []string
	var createOut *output
	create := &cobra.Command{Use: "create NAME --size S", Short: "Create a named ext4 volume", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := config.ParseSize(size)
			if err != nil {
				return usageError{fmt.Errorf("--size %q: %v", size, err)}
			}
			labels, err := parseLabels(volLabels)
			if err != nil {
				return err
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				v, err := m.VolumeCreate(cmd.Context(), args[0], n, labels)
				if err != nil {
					return err
				}
				return printResult(cmd, createOut, v, func() []string { return []string{v.Name} }, func() { fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", v.Name, formatSize(v.SizeBytes)) })
			})
		}}
	create.Flags().StringVar(&size, "size", "", "size, e.g. 512M, 1.5G or 2GiB; K, M, G, T alone are binary, KB, MB, GB decimal (required)")
	addLabelFlag(create, &volLabels, "the volume")
	createOut = addOutput(create, true)
	requireFlags(create, "size")
	var lsOut *output
	var volFilters []string
	ls := &cobra.Command{Use: "ls", Short: "List named volumes", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filters, err := parseFilters(volFilters, projections.VolumeFilters)
			if err != nil {
				return err
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				vols, err := m.Volumes(cmd.Context())
				if err != nil {
					return err
				}
				vols = slices.DeleteFunc(vols, func(v projections.Volume) bool { return !filters.Match(projections.VolumeFacts(v)) })
				return printList(cmd, lsOut, vols, func(v projections.Volume) string { return v.Name }, volumeTable(lsOut))
			})
		}}
	lsOut = addOutput(ls, true)
	addFilterFlag(ls, &volFilters, projections.VolumeFilters)
	addNoTrunc(ls, lsOut)
	var rmYes, rmDry bool
	rm := &cobra.Command{Use: "rm NAME...", Short: "Delete volumes and their files (refused while attached; asks first unless --yes)", Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				vols, err := m.Volumes(cmd.Context())
				if err != nil {
					return err
				}
				// Only names that exist are asked about; an unknown one
				// fails on its own below.
				var known []string
				for _, v := range vols {
					if slices.Contains(args, v.Name) {
						known = append(known, v.Name)
					}
				}
				if rmDry {
					return eachRef(cmd, args, func(name string) error {
						v, err := m.VolumeRemovePlan(cmd.Context(), name)
						if err == nil {
							fmt.Fprintf(cmd.OutOrStdout(), "would remove volume %s (%s) and its files\n", v.Name, formatSize(v.SizeBytes))
						}
						return err
					})
				}
				if err := confirmDelete(cmd, rmYes, "volume rm", known); err != nil {
					return err
				}
				return eachRef(cmd, args, func(name string) error {
					if err := m.VolumeRemove(cmd.Context(), name); err != nil {
						return err
					}
					fmt.Fprintf(cmd.OutOrStdout(), "removed volume %s\n", name)
					return nil
				})
			})
		}}
	rm.Flags().BoolVarP(&rmYes, "yes", "y", false, "delete without asking (needed when stdin is not a terminal)")
	rm.Flags().BoolVar(&rmDry, "dry-run", false, "print what would be deleted (or why it would be refused); change nothing")
	var apply, dryRun, detached, pruneYes bool
	var pruneOut *output
	prune := &cobra.Command{Use: "prune [--apply [--include-detached [--yes]]]", Short: "Clear stale attachments (dry run unless --apply); with --include-detached also delete unattached volumes", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if apply && dryRun {
				return usageError{errors.New("--apply and --dry-run exclude each other")}
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				var only []string
				if apply && detached {
					// Name every volume to be deleted before deleting
					// any, and delete no other: the dry run's list is
					// what the user confirms and all that is deleted.
					dry, err := m.VolumePrune(cmd.Context(), false, true)
					if err != nil {
						return err
					}
					if err := confirmDelete(cmd, pruneYes, "volume prune --apply --include-detached", dry.Detached); err != nil {
						return err
					}
					only = dry.Detached
				}
				rep, err := m.VolumePrune(cmd.Context(), apply, apply && detached && len(only) > 0, only...)
				if err != nil {
					return err
				}
				ids := func() []string { return rep.Removed }
				if !apply && detached {
					ids = func() []string { return rep.Detached }
				}
				return printValue(cmd, pruneOut, rep, ids, func(w io.Writer) { volumePruneHuman(w, rep, detached) })
			})
		}}
	prune.Flags().BoolVar(&apply, "apply", false, "act (default: report only)")
	prune.Flags().BoolVar(&dryRun, "dry-run", false, "report only, change nothing (the default; for symmetry with the other prunes)")
	prune.Flags().BoolVar(&detached, "include-detached", false, "also delete volumes no sandbox has attached (with --apply; a dry run lists them)")
	prune.Flags().BoolVarP(&pruneYes, "yes", "y", false, "delete detached volumes without asking (needed when stdin is not a terminal)")
	pruneOut = addOutput(prune, true)
	c.AddCommand(create, ls, rm, prune)
	return c
}

// volumePruneHuman names every attachment and volume the prune cleared,
// deleted, or (dry) would, and the detached volumes it kept.
func volumePruneHuman(w io.Writer, rep session.PruneReport, detached bool) {
	clear, del, deleted := "would clear", "would delete", []string(nil)
	switch {
	case rep.Apply:
		clear, del, deleted = "cleared", "deleted", rep.Removed
	case detached:
		deleted = rep.Detached
	}
	for _, s := range rep.Stale {
		fmt.Fprintf(w, "%s stale attachment %s\n", clear, s)
	}
	for _, v := range rep.Detached {
		if slices.Contains(deleted, v) {
			fmt.Fprintf(w, "%s volume %s\n", del, v)
		} else {
			fmt.Fprintf(w, "kept detached volume %s (--apply --include-detached deletes it)\n", v)
		}
	}
	fmt.Fprintf(w, "%s %d stale attachment(s); %s %d volume(s)\n", clear, len(rep.Stale), del, len(deleted))
}

func volumeTable(o *output) table[projections.Volume] {
	return table[projections.Volume]{
		header: []string{"NAME", "SIZE", "ATTACHED"},
		row: func(v projections.Volume) []string {
			ids := make([]string, len(v.AttachedTo))
			for i, id := range v.AttachedTo {
				ids[i] = o.id(id)
			}
			return []string{v.Name, formatSize(v.SizeBytes), strings.Join(ids, ",")}
		},
		labels: func(v projections.Volume) events.Labels { return v.Labels },
	}
}

func logsCmd(g *globals) *cobra.Command {
	var opt session.LogOptions
	var since string
	c := &cobra.Command{
		Use:   "logs ID|HANDLE",
		Short: "Print a sandbox's console, VMM or supervisor log",
		Long: `Print a sandbox's console, VMM or supervisor log.

The console log (the guest's serial console) carries no times of its own:
the sandbox's supervisor notes, about once a second, how far the log has
grown. --timestamps prefixes each line with the time the supervisor first
saw it whole, and --since starts at the first line seen at or after a time;
both are accurate to about a second, and are times the host saw a line, not
when the guest wrote it. A line the supervisor has not noted (it was
written while none ran) gets the log's modification time. The VMM and
supervisor logs have no such index: --since and --timestamps refuse them.`,
		Example: `  nexus logs web --since 10m --timestamps
  nexus logs web --since 2026-01-02T15:04:05Z -n 20 -f`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !slices.Contains(session.LogKinds(), opt.Kind) {
				return usageError{fmt.Errorf("--log %q: want one of %v", opt.Kind, session.LogKinds())}
			}
			if opt.Tail < 0 {
				return usageError{fmt.Errorf("--tail %d: want a number of lines, 0 for all", opt.Tail)}
			}
			if since != "" {
				t, ok := parseWhen(since, time.Now())
				if !ok {
					return usageError{fmt.Errorf("--since %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or an age (10m, 36h, 7d)", since)}
				}
				opt.Since = t
			}
			if err := opt.Check(); err != nil {
				return usageError{err}
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				return m.Logs(cmd.Context(), args[0], opt, cmd.OutOrStdout())
			})
		},
	}
	c.Flags().StringVar(&opt.Kind, "log", "console", "which log: console (the guest's serial console), vmm or supervisor")
	c.Flags().IntVarP(&opt.Tail, "tail", "n", 0, "print only the last N lines (0: the whole log)")
	c.Flags().BoolVarP(&opt.Follow, "follow", "f", false, "keep printing what is appended until interrupted or the sandbox is removed")
	c.Flags().StringVar(&since, "since", "", "start at the first line seen at or after this RFC 3339 time or age (10m); console log only, to about a second")
	c.Flags().BoolVarP(&opt.Timestamps, "timestamps", "t", false, "prefix each line with the time the host first saw it (UTC, to about a second); console log only")
	return c
}
