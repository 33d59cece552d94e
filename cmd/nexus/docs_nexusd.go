//go:build nexusd

package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// writeManPages writes a man page for every command into dir.
func writeManPages(cmd *cobra.Command, dir string) error {
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
}
