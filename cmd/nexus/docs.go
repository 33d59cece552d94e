package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
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
			dir := args[0]
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true // pages do not change with the day they were made
			header := &doc.GenManHeader{Title: "NEXUS", Section: "1", Source: "nexus " + readVersion().Version, Manual: "nexus manual"}
			if err := doc.GenManTree(root, header, dir); err != nil {
				return fmt.Errorf("man pages in %s: %w", dir, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "man pages written to %s\n", dir)
			return nil
		},
	})
	return c
}
