package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

var errNotBuilt = errors.New("not implemented yet")

// addNotBuilt registers the commands of the public contract whose flows
// have not landed, so scripts see a clear refusal (exit 1), not "unknown
// command" (exit 2).
func addNotBuilt(root *cobra.Command) {
	stub := func(use, short string, subs ...string) *cobra.Command {
		c := &cobra.Command{Use: use, Short: short + " (not implemented yet)", DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return fmt.Errorf("%s: %w", cmd.CommandPath(), errNotBuilt)
			}}
		for _, s := range subs {
			c.AddCommand(&cobra.Command{Use: s, DisableFlagParsing: true, RunE: c.RunE})
		}
		return c
	}
	root.AddCommand(
		stub("run", "Run a command with sandboxes bound to its lifetime"),
	)
}
