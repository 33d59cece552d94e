package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every `nexus ...` command line the README and the command reference show
// (in code blocks and in inline code) names a real command, and every flag
// on it is one that command has.
func TestReadmeCommandsAndFlagsExist(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{"README.md", "docs/commands.md"} {
		t.Run(doc, func(t *testing.T) { checkDocCommands(t, doc) })
	}
}

// checkDocCommands checks the nexus command lines of one file of the
// repository, named from its root.
func checkDocCommands(t *testing.T, doc string) {
	data, err := os.ReadFile("../../" + doc)
	if err != nil {
		t.Fatal(err)
	}
	root := newRoot()
	root.InitDefaultCompletionCmd()
	var lines []string
	inBlock := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inBlock = !inBlock
			continue
		}
		if inBlock {
			lines = append(lines, line)
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]*nexus [^`]*)`").FindAllStringSubmatch(line, -1) {
			lines = append(lines, m[1])
		}
	}
	// Commands joined with ";" on one line are checked one by one.
	var commands []string
	for _, line := range lines {
		line, _, _ = strings.Cut(line, "#") // a comment
		commands = append(commands, strings.Split(line, ";")...)
	}
	checked := 0
	for _, line := range commands {
		words := strings.Fields(line)
		at := -1
		for i, w := range words {
			if w == "nexus" || strings.HasSuffix(w, "/nexus") || w == "<(nexus" {
				at = i
				break
			}
		}
		if at < 0 {
			continue
		}
		cmd, rest := findCommand(root, words[at+1:])
		if cmd == nil {
			t.Errorf("%s: %q names no nexus command", doc, line)
			continue
		}
		checked++
		for _, w := range rest {
			if w == "--" {
				break // what follows is the guest command's, not nexus's
			}
			w = strings.Trim(w, "[](){},.;:")
			w = strings.TrimSuffix(w, "...")
			w = strings.Trim(w, "[]")
			if !strings.HasPrefix(w, "-") || w == "-" {
				continue
			}
			name, _, _ := strings.Cut(w, "=")
			var ok bool
			if long, isLong := strings.CutPrefix(name, "--"); isLong {
				ok = cmd.Flags().Lookup(long) != nil || cmd.InheritedFlags().Lookup(long) != nil
			} else if len(name) == 2 {
				ok = cmd.Flags().ShorthandLookup(name[1:]) != nil || cmd.InheritedFlags().ShorthandLookup(name[1:]) != nil
			} else {
				continue // not a flag: a negative number or a dash in prose
			}
			if !ok {
				t.Errorf("%s: %q: nexus %s has no flag %s", doc, line, commandKey(cmd), name)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d command lines checked in %s: the parser is broken", checked, doc)
	}
}

// findCommand walks words from root through subcommand names, skipping
// global flags and their values before the command, and returns the
// command and the words after it.
func findCommand(root *cobra.Command, words []string) (*cobra.Command, []string) {
	cmd := root
	for i := 0; i < len(words); i++ {
		w := words[i]
		if strings.HasPrefix(w, "-") {
			// A global flag before the command: skip it and its value.
			if name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "="); !hasValue {
				if f := root.PersistentFlags().Lookup(name); f != nil && f.Value.Type() != "bool" {
					i++
				}
			}
			if cmd == root {
				continue
			}
			return cmd, words[i:]
		}
		next, _, err := cmd.Find([]string{strings.Trim(w, "`)")})
		if err != nil || next == cmd {
			if cmd == root {
				return nil, nil
			}
			return cmd, words[i:]
		}
		cmd = next
	}
	if cmd == root {
		return nil, nil
	}
	return cmd, nil
}
