package main

import (
	"errors"

	"github.com/spf13/cobra"
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
			return repairJournal(cmd, g, backup, o)
		},
	}
	repair.Flags().StringVar(&backup, "backup", "", "directory to copy the store into first (must be missing or empty)")
	o = addOutput(repair, false)
	c.AddCommand(repair)
	return c
}
