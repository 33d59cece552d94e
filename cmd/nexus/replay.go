package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/replay"
)

// errJournalProblems is verify's refusal: the report has been printed.
var errJournalProblems = errors.New("the journal has problems (listed above)")

// errDivergence is diff's: the divergences have been printed.
var errDivergence = errors.New("the state root and its journal disagree (listed above)")

type replayFlags struct {
	journalDir string
	natsURL    string
	stream     string
	natsCreds  string
	natsPrefix string
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
	c.PersistentFlags().StringVar(&f.natsURL, "nats", "", "audit a mirror stream on this NATS server (a fleet's, see daemon --mirror) instead")
	c.PersistentFlags().StringVar(&f.stream, "stream", "", "the mirror stream to read with --nats (NEXUS_<HOST>)")
	c.PersistentFlags().StringVar(&f.natsCreds, "nats-creds", "", "NATS .creds file for --nats")
	c.PersistentFlags().StringVar(&f.natsPrefix, "nats-api-prefix", "", "JetStream API prefix for --nats (an auditor of nexus fleet template: "+fleetstate.AuditAPIPrefix+")")
	c.PersistentFlags().BoolVar(&f.asJSON, "json", false, "print JSON")
	c.AddCommand(replayTimelineCmd(g, f), replayAtCmd(g, f), replayVerifyCmd(g, f), replayDiffCmd(g, f))
	return c
}

func replayTimelineCmd(g *globals, f *replayFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "timeline ID|HANDLE",
		Short: "Every event of one sandbox, in order, with its saga and step",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			recs, err := readJournal(cmd.Context(), g, f)
			if err != nil {
				return err
			}
			_, entries, err := replay.TimelineOf(recs, args[0])
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
	fmt.Fprintln(tw, "SEQ\tTIME\tTYPE\tSAGA\tSTEP\tDATA")
	for _, e := range entries {
		data, _ := json.Marshal(e.Payload)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.Format("2006-01-02T15:04:05.000Z"), e.Type,
			dash(e.Saga), dash(e.Step), data)
	}
	return tw.Flush()
}

func replayAtCmd(g *globals, f *replayFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "at SEQ|TIME|AGE",
		Short: "The projections (sandboxes, ownership, volumes, open sagas) as they stood at a sequence, an RFC 3339 time or an age (10m, 7d)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := parsePoint(args[0], time.Now())
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
				return printJSON(cmd.OutOrStdout(), replayStateJSON(st))
			}
			return printState(cmd.OutOrStdout(), st)
		},
	}
}

// parsePoint reads a point of the journal the way --since reads one.
func parsePoint(s string, now time.Time) (replay.Point, error) {
	seq, t, err := parsePosition("at", s, now)
	if err != nil {
		return replay.Point{}, err
	}
	if seq == 0 && t.IsZero() {
		return replay.Point{}, errors.New("sequence numbers start at 1")
	}
	return replay.Point{Seq: seq, Time: t}, nil
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
		Short: "Re-decode every event; check sequence continuity, unique message ids, finished sagas, one live sandbox per handle (exit 1 on a problem)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			add, finish := replay.NewVerifier().Concurrent()
			err := eachRecord(cmd.Context(), g, f, add)
			rep := finish()
			if err != nil {
				return err
			}
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
	section("events outside an open saga", rep.OutsideSaga)
	section("handles held by two live sandboxes", rep.SharedHandles)
	fmt.Fprintf(out, "unfinished sagas: %d\n", len(rep.OpenSagas))
	for _, sg := range rep.OpenSagas {
		fmt.Fprintf(out, "  %s: %s of %s, done %v\n", sg.ID, sg.Kind, sg.Sandbox, sg.Done)
	}
}

func replayDiffCmd(g *globals, f *replayFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "diff",
		Short: "Where the state root and the journal disagree: untracked files, missing owned resources, unfinished sagas, reaps of owned paths (exit 1 on any)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			recs, err := readJournal(cmd.Context(), g, f)
			if err != nil {
				return err
			}
			d, err := diffRoot(g.stateDir, recs)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.asJSON {
				if err := printJSON(out, d); err != nil {
					return err
				}
			} else {
				printDiff(out, d)
			}
			if !d.Empty() {
				return errDivergence
			}
			return nil
		},
	}
}

func printDiff(out io.Writer, d replay.Divergence) {
	fmt.Fprintf(out, "on disk, attributed by no event: %d\n", len(d.Untracked))
	for _, p := range d.Untracked {
		fmt.Fprintf(out, "  %s\n", p)
	}
	fmt.Fprintf(out, "owned by the journal, missing on disk: %d\n", len(d.Missing))
	for _, m := range d.Missing {
		fmt.Fprintf(out, "  %s (%s of %s)\n", m.Path, m.Kind, m.Sandbox)
	}
	fmt.Fprintf(out, "unfinished sagas: %d\n", len(d.OpenSagas))
	for _, sg := range d.OpenSagas {
		fmt.Fprintf(out, "  %s: %s of %s, done %v\n", sg.ID, sg.Kind, sg.Sandbox, sg.Done)
	}
	fmt.Fprintf(out, "reaped while owned: %d\n", len(d.ReapedOwned))
	for _, r := range d.ReapedOwned {
		fmt.Fprintf(out, "  seq %d: %s (owned by %s)\n", r.Seq, r.Path, r.Owner)
	}
}
