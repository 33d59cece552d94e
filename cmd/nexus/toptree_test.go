package main

import (
	"testing"

	"github.com/spf13/cobra"
)

// TestTopCommandsAreTheTree: topCommands names every command of the whole
// tree (but the hidden ones and docs), and a command line naming one by
// its name or an alias builds that command alone, whichever root flags it
// is given with; any other line builds the whole tree.
func TestTopCommandsAreTheTree(t *testing.T) {
	full := newRoot()
	built := map[string]*cobra.Command{}
	for _, c := range full.Commands() {
		if !c.Hidden && c.Name() != "docs" {
			built[c.Name()] = c
		}
	}
	for _, tc := range topCommands {
		c := built[tc.names[0]]
		if c == nil {
			t.Errorf("topCommands names %q; the tree has no such command", tc.names[0])
			continue
		}
		delete(built, tc.names[0])
		for _, name := range tc.names {
			for _, args := range [][]string{{name}, {"--state-dir", t.TempDir(), name, "--help"}, {name, "x", "--wait"}} {
				root := newRootFor(args)
				if got := root.Commands(); len(got) != 1 || got[0].Name() != tc.names[0] {
					t.Errorf("%v built %d commands, want %s alone", args, len(got), tc.names[0])
				}
			}
		}
	}
	for name := range built {
		t.Errorf("%s is not in topCommands: a command line naming it gets the whole tree", name)
	}
	whole := len(full.Commands())
	for _, args := range [][]string{nil, {"--help"}, {"help", "ls"}, {"frobnicate"}, {cobra.ShellCompRequestCmd, "ls", ""}, {"docs", "markdown"}} {
		if got := len(newRootFor(args).Commands()); got != whole {
			t.Errorf("%v built %d commands, want the whole tree's %d", args, got, whole)
		}
	}
}
