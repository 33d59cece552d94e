//go:build nexusd

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/control/local"
)

// repairJournal repairs the journal in this process, which holds the store.
func repairJournal(cmd *cobra.Command, g *globals, backup string, o *output) error {
	// Settings that cannot start a daemon leave none to retire.
	co, _ := connectOptions(g)
	rep, err := local.RepairJournal(cmd.Context(), g.stateDir, backup, co)
	if err != nil {
		return err
	}
	return printResult(cmd, o, rep, nil, func() { repairHuman(cmd, rep) })
}

func repairHuman(cmd *cobra.Command, rep local.RepairReport) {
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
