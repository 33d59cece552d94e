package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/reaper"
	"github.com/nexus-sandbox/nexus/session"
)

func reapCmd(g *globals) *cobra.Command {
	var o session.ReapOptions
	var kind, olderThan string
	var dryRun bool
	var out *output
	c := &cobra.Command{
		Use:   "reap",
		Short: "Report orphaned resources (dry run); --apply deletes them",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Apply && dryRun {
				return usageError{errors.New("--apply and --dry-run exclude each other")}
			}
			if o.Plan != "" && !o.Apply {
				return usageError{errors.New("--plan needs --apply (a dry run makes a new plan)")}
			}
			if o.Plan != "" && !layout.IsULID(strings.ToUpper(o.Plan)) {
				return usageError{fmt.Errorf("--plan %q is not a plan id", o.Plan)}
			}
			o.Plan = strings.ToUpper(o.Plan)
			if kind != "" {
				if !slices.Contains(reaper.Kinds, events.ResourceKind(kind)) {
					return usageError{fmt.Errorf("--kind %q: want one of %v", kind, reaper.Kinds)}
				}
				o.Filter.Kind = events.ResourceKind(kind)
			}
			if olderThan != "" {
				d, err := parseAge(olderThan)
				if err != nil {
					return usageError{fmt.Errorf("--older-than %q: %v", olderThan, err)}
				}
				o.Filter.OlderThan = int64(d / time.Second)
				if o.Filter.OlderThan == 0 && d > 0 {
					o.Filter.OlderThan = 1
				}
			}
			if layout.IsULID(strings.ToUpper(o.Filter.Sandbox)) {
				o.Filter.Sandbox = strings.ToUpper(o.Filter.Sandbox)
			}
			// The plain report shows how many owned entries were kept,
			// not which.
			o.CountOwned = !out.json && out.format == "" && !out.quiet
			rep, err := runReap(cmd.Context(), g, o)
			if rep == nil {
				return err
			}
			ids := func() []string {
				// What was deleted, or (dry) what --apply would delete.
				items := rep.Orphans
				if rep.Apply {
					items = rep.Deleted
				}
				var paths []string
				for _, it := range items {
					paths = append(paths, it.Path)
				}
				return paths
			}
			if perr := printValue(cmd, out, rep, ids, func(io.Writer) { reapHuman(cmd, rep) }); perr != nil {
				return perr
			}
			if err != nil {
				return err
			}
			if len(rep.Failed) > 0 {
				return fmt.Errorf("reap --apply: %d resource(s) could not be deleted (see failed)", len(rep.Failed))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&o.Apply, "apply", false, "delete the orphans (default: report only)")
	c.Flags().StringVar(&o.Plan, "plan", "", "with --apply: delete only what this dry run's plan listed, re-checking each entry")
	c.Flags().StringVar(&kind, "kind", "", "only resources of this kind")
	c.Flags().StringVar(&o.Filter.Sandbox, "sandbox", "", "only resources of this sandbox (ULID, or handle for shadow disks)")
	c.Flags().StringVar(&olderThan, "older-than", "", "only resources whose mtime is older than this duration")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "report only (the default)")
	out = addOutput(c, true)
	return c
}

// runReap reaps the state root (session.Reap: a journal that cannot be
// fully read keeps everything).
func runReap(ctx context.Context, g *globals, o session.ReapOptions) (*session.ReapReport, error) {
	root, err := control.PrepareRoot(g.stateDir)
	if err != nil {
		return nil, err
	}
	co, err := connectOptions(g)
	if err != nil {
		return nil, err
	}
	rep, err := session.Reap(ctx, root, co, testHooks(), o)
	return rep, inNexusd(err)
}

func reapHuman(cmd *cobra.Command, rep *session.ReapReport) {
	w := cmd.OutOrStdout()
	mode := "dry run"
	if rep.Apply {
		mode = "apply"
	}
	if rep.Journal != "" {
		fmt.Fprintf(w, "journal cannot be fully read, everything is kept: %s\n", rep.Journal)
	}
	fmt.Fprintf(w, "reap (%s): %d scanned, %d orphan(s), %d kept (%d owned)\n", mode, rep.Scanned, len(rep.Orphans), rep.KeptCount(), rep.OwnedCount())
	line := func(tag string, it session.ReapItem) {
		fmt.Fprintf(w, "  %-9s %-18s %s  owner=%s  %s  %s", tag, it.Kind, it.Path, dash(it.Owner), formatSize(it.Allocated), it.Reason)
		if it.Error != "" {
			fmt.Fprintf(w, "  error: %s", it.Error)
		}
		fmt.Fprintln(w)
	}
	if !rep.Apply {
		for _, it := range rep.Orphans {
			line("orphan", it)
		}
	}
	for _, it := range rep.Kept {
		if !it.Owned() {
			line(string(it.Verdict), it)
		}
	}
	for _, it := range rep.Deleted {
		line("deleted", it)
	}
	for _, it := range rep.Failed {
		line("FAILED", it)
	}
	for _, e := range rep.ScanErrors {
		fmt.Fprintf(w, "  unreadable directory (nothing in it judged): %s\n", e)
	}
	if rep.Apply {
		fmt.Fprintf(w, "deleted %d (%s allocated), failed %d\n", len(rep.Deleted), formatSize(rep.Allocated), len(rep.Failed))
	} else if rep.Plan != "" {
		fmt.Fprintf(w, "would free %s allocated; plan %s: apply exactly it with `nexus reap --apply --plan %s`\n", formatSize(rep.Allocated), rep.Plan, rep.Plan)
	}
}
