package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/replay"
)

// errJournalProblems is verify's refusal: the report has been printed.
var errJournalProblems = errors.New("the journal has problems (listed above)")

type replayFlags struct {
	journalDir string
	asJSON     bool
}

func replayCmd(g *globals) *cobra.Command {
	f := &replayFlags{}
	c := &cobra.Command{
		Use:   "replay",
		Short: "Audit the journal: a sandbox's timeline, the state at a point, verification",
		Long: "replay reads a private copy of the journal, so it works while a daemon runs,\n" +
			"on a journal directory copied off another host (--journal), and never\n" +
			"modifies the store it audits.",
	}
	c.PersistentFlags().StringVar(&f.journalDir, "journal", "", "audit this journal directory instead of the state root's")
	c.PersistentFlags().BoolVar(&f.asJSON, "json", false, "print JSON")
	c.AddCommand(replayTimelineCmd(g, f), replayAtCmd(g, f), replayVerifyCmd(g, f))
	return c
}

// readJournal returns every record of the audited journal, read from a
// copy made in a scratch directory that is removed before returning.
func readJournal(ctx context.Context, g *globals, f *replayFlags) ([]replay.Record, error) {
	dir := f.journalDir
	if dir == "" {
		dir = filepath.Join(g.stateDir, "journal")
	}
	scratch, err := os.MkdirTemp("", "nexus-replay-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	j, err := journal.OpenCopy(ctx, dir, scratch)
	if err != nil {
		return nil, err
	}
	defer j.Close()
	var recs []replay.Record
	err = j.Read(ctx, 1, "", func(r journal.Record) error {
		recs = append(recs, replay.Record{Seq: r.Seq, MsgID: r.MsgID, Data: r.Data})
		return nil
	})
	return recs, err
}

func replayTimelineCmd(g *globals, f *replayFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "timeline ID|HANDLE",
		Short: "Every event of one sandbox, in order, with saga, step and causation",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			recs, err := readJournal(cmd.Context(), g, f)
			if err != nil {
				return err
			}
			id, err := replay.Resolve(recs, args[0])
			if err != nil {
				return err
			}
			entries, err := replay.Timeline(recs, id)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), entries)
			}
			return printTimeline(cmd.OutOrStdout(), entries)
		},
	}
}

func printTimeline(out io.Writer, entries []replay.Entry) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tTYPE\tSAGA\tSTEP\tCAUSATION\tDATA")
	for _, e := range entries {
		data, _ := json.Marshal(e.Payload)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.Format("2006-01-02T15:04:05.000Z"), e.Type,
			dash(e.Saga), dash(e.Step), dash(e.Causation), data)
	}
	return tw.Flush()
}

func replayAtCmd(g *globals, f *replayFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "at SEQ|TIME",
		Short: "The projections (sandboxes, ownership, volumes, open sagas) as they stood at a sequence or RFC 3339 time",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := parsePoint(args[0])
			if err != nil {
				return usageError{err}
			}
			recs, err := readJournal(cmd.Context(), g, f)
			if err != nil {
				return err
			}
			st, err := replay.At(recs, p)
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), st)
			}
			return printState(cmd.OutOrStdout(), st)
		},
	}
}

func parsePoint(s string) (replay.Point, error) {
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		if n == 0 {
			return replay.Point{}, errors.New("sequence numbers start at 1")
		}
		return replay.Point{Seq: n}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return replay.Point{}, fmt.Errorf("%q is neither a journal sequence nor an RFC 3339 time", s)
	}
	return replay.Point{Time: t}, nil
}

func printState(out io.Writer, st replay.State) error {
	fmt.Fprintf(out, "as of seq %d (%s)\n\n", st.Seq, st.Time.Format(time.RFC3339Nano))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tHANDLE\tSTATE\tRESOURCES")
	for _, sb := range st.Sandboxes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", sb.ID, dash(sb.Handle), sb.State, len(sb.Resources))
	}
	tw.Flush()
	fmt.Fprintf(out, "\n%d owned paths, %d volumes, %d open sagas\n", len(st.Ownership), len(st.Volumes), len(st.OpenSagas))
	for _, sg := range st.OpenSagas {
		fmt.Fprintf(out, "  open saga %s: %s of %s, done %v\n", sg.ID, sg.Kind, sg.Sandbox, sg.Done)
	}
	return nil
}

func replayVerifyCmd(g *globals, f *replayFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "verify",
		Short: "Re-decode every event; check sequence continuity, unique message ids, finished sagas (exit 1 on a problem)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			recs, err := readJournal(cmd.Context(), g, f)
			if err != nil {
				return err
			}
			rep := replay.Verify(recs)
			out := cmd.OutOrStdout()
			if f.asJSON {
				if err := printJSON(out, rep); err != nil {
					return err
				}
			} else {
				printVerify(out, rep)
			}
			if !rep.OK() || len(rep.OpenSagas) > 0 {
				return errJournalProblems
			}
			return nil
		},
	}
}

func printVerify(out io.Writer, rep replay.Report) {
	fmt.Fprintf(out, "%d events\n", rep.Events)
	section := func(name string, items []string) {
		fmt.Fprintf(out, "%s: %d\n", name, len(items))
		for _, s := range items {
			fmt.Fprintf(out, "  %s\n", s)
		}
	}
	section("sequence gaps", rep.Gaps)
	section("repeated message ids", rep.DuplicateID)
	section("undecodable records", rep.Undecodable)
	section("records from a newer schema (not read)", rep.NewerSchema)
	fmt.Fprintf(out, "unfinished sagas: %d\n", len(rep.OpenSagas))
	for _, sg := range rep.OpenSagas {
		fmt.Fprintf(out, "  %s: %s of %s, done %v\n", sg.ID, sg.Kind, sg.Sandbox, sg.Done)
	}
}
