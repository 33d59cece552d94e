package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/control"
)

func journalCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "journal", Short: "Maintain the journal store (<state-root>/journal)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{errors.New("journal needs a subcommand: repair")}
		}}
	var backup string
	var o *output
	repair := &cobra.Command{
		Use:   "repair --backup DIR",
		Short: "Copy the store to DIR, then cut a torn tail off its last block and report exactly what was cut (never run automatically)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if backup == "" {
				return usageError{errors.New("--backup DIR is required: repair copies the store there before cutting anything")}
			}
			// Settings that cannot start a daemon leave none to retire.
			co, _ := connectOptions(g)
			rep, err := control.RepairJournal(cmd.Context(), g.stateDir, backup, co)
			if err != nil {
				return err
			}
			return printResult(cmd, o, rep, nil, func() { repairHuman(cmd, rep) })
		},
	}
	repair.Flags().StringVar(&backup, "backup", "", "directory to copy the store into first (must be missing or empty)")
	o = addOutput(repair, false)
	c.AddCommand(repair)
	return c
}

func repairHuman(cmd *cobra.Command, rep control.RepairReport) {
	out := cmd.OutOrStdout()
	if rep.Whole {
		fmt.Fprintf(out, "journal %s is whole: nothing cut, no backup made\n", rep.Dir)
		return
	}
	fmt.Fprintf(out, "cut %d bytes from %s at offset %d (%s)\n", rep.CutBytes, rep.Block, rep.Offset, rep.Reason)
	fmt.Fprintf(out, "last whole record: sequence %d\n", rep.LastGoodSeq)
	if rep.FirstLostSeq != 0 {
		fmt.Fprintf(out, "lost: sequence %d (the torn record)\n", rep.FirstLostSeq)
	} else {
		fmt.Fprintf(out, "lost: no sequence readable in the cut bytes\n")
	}
	for _, f := range rep.Removed {
		fmt.Fprintf(out, "removed %s (the server rebuilds it from the blocks)\n", f)
	}
	fmt.Fprintf(out, "the store as it was: %s\n", rep.Backup)
}
