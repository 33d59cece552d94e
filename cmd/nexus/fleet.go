package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
)

func fleetCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "fleet",
		Short: "This host's mirror on the fleet, the fleet's permission template, and fleet-wide reads",
	}
	c.AddCommand(fleetStatusCmd(g), fleetTemplateCmd(), fleetAggregateCmd(), fleetEventsCmd(), fleetFindCmd(), fleetTimelineCmd())
	return c
}

func fleetStatusCmd(g *globals) *cobra.Command {
	var o *output
	c := &cobra.Command{
		Use:   "status",
		Short: "Show the mirror's link, stream and lag, as the daemon sees them",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := control.FleetStatus(cmd.Context(), g.stateDir)
			if err != nil {
				return err
			}
			return printValue(cmd, o, st, nil, func(w io.Writer) { printMirrorState(w, st) })
		},
	}
	o = addOutput(c, false)
	return c
}

func printMirrorState(w io.Writer, st *fleetstate.MirrorState) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	link := "down"
	if st.Connected {
		link = "connected"
	}
	fmt.Fprintf(tw, "host\t%s (%s)\n", st.Host, st.HostID)
	if st.LinkedNode != "" {
		link += fmt.Sprintf(" to %s at %s", st.LinkedNode, st.LinkedAddr)
	}
	fmt.Fprintf(tw, "link\t%s via %s\n", link, strings.Join(st.URLs, ", "))
	switch {
	case st.Exists:
		fmt.Fprintf(tw, "mirror\t%s in domain %s, %d replicas\n", st.Stream, st.Domain, st.Replicas)
		fmt.Fprintf(tw, "sequence\tjournal %d, mirror %d to %d, reported %d\n", st.JournalLastSeq, st.MirrorFirstSeq, st.MirrorLastSeq, st.ReportedSeq)
		fmt.Fprintf(tw, "lag\t%d events, %.1fs\n", st.LagEvents, st.LagSeconds)
		if st.MissingEvents > 0 {
			fmt.Fprintf(tw, "missing\t%d events up to the mirror's last are not in it\n", st.MissingEvents)
		}
	default:
		fmt.Fprintf(tw, "mirror\t%s in domain %s: not seen on the fleet\n", st.Stream, st.Domain)
		fmt.Fprintf(tw, "sequence\tjournal %d\n", st.JournalLastSeq)
	}
	if st.Exists {
		checked := "no digest journaled yet"
		if st.DigestSeq > 0 {
			checked = fmt.Sprintf("records 1 to %d hashed against the journal's digest", st.DigestSeq)
		}
		if len(st.FailedChecks) == 0 {
			fmt.Fprintf(tw, "checks\tfirst sequence, count, last sequence, digest: ok (%s)\n", checked)
		}
		for _, f := range st.FailedChecks {
			fmt.Fprintf(tw, "FAILED\t%s\n", f)
		}
	}
	if st.Drift != "" {
		fmt.Fprintf(tw, "kept\t%s\n", st.Drift)
	}
	if st.LastError != "" {
		fmt.Fprintf(tw, "error\t%s\n", st.LastError)
	}
	tw.Flush()
}

func fleetTemplateCmd() *cobra.Command {
	var hosts []string
	var t templateFlags
	var domain, maxBytes string
	c := &cobra.Command{
		Use:   "template --host NAME [--host NAME...]",
		Short: "Print the fleet's account and permission configuration: one account per host, a read-only auditor, the aggregator, the operator",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fleetTemplate(cmd, hosts, t, domain, maxBytes)
		},
	}
	c.Flags().StringArrayVar(&hosts, "host", nil, "a host name of the fleet (repeat, or separate with commas)")
	c.Flags().StringVar(&t.auditor, "auditor", "auditor", "the auditors' user name (reads only)")
	c.Flags().StringVar(&t.aggregator, "aggregator", "aggregator", "the user that creates and keeps the aggregate (nexus fleet aggregate)")
	c.Flags().StringVar(&t.operator, "operator", "operator", "the user that repairs mirrors and the aggregate (update, delete)")
	c.Flags().IntVar(&t.maxStreams, "max-streams", 2, "JetStream streams of each host's account (a host makes 2: its mirror and its report; 0: no limit)")
	c.Flags().StringVar(&domain, "domain", "fleet", "the fleet's JetStream domain (daemon --mirror-domain)")
	c.Flags().StringVar(&maxBytes, "max-bytes", "0", "JetStream storage limit of each host's account (0: none)")
	return c
}

// templateFlags are fleet template's account names and limit.
type templateFlags struct {
	auditor, aggregator, operator string
	maxStreams                    int
}
