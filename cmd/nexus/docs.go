package main

import (
	"github.com/spf13/cobra"
)

// docsCmd writes reference documentation generated from the command tree,
// so man pages can never describe flags the binary does not have.
func docsCmd() *cobra.Command {
	c := &cobra.Command{Use: "docs", Short: "Generate reference documentation from the commands themselves"}
	c.AddCommand(&cobra.Command{
		Use:   "man DIR",
		Short: "Write a man page (section 1) for every command into DIR",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return writeManPages(cmd, args[0])
		},
	})
	return c
}
