package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/internal/testutil"
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

// TestReadmeQuickstartOutput runs the README's quickstart, command by
// command, in a fresh directory and state root on the process driver, and
// compares what each command prints (stdout and stderr) with what the
// README shows. Values that differ per run compare by shape only: IDs
// (each README ID stands for one real ID throughout, so a later command
// that names it runs with the real one), numbers, times, ages and the
// directory the quickstart ran in. A README line ending in "..." was cut:
// its words before the dots must begin the real line.
func TestReadmeQuickstartOutput(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	steps := quickstartSteps(t, "../../README.md")
	dir, root := t.TempDir(), shortRoot(t)
	stopDaemonsAtEnd(t, root)
	ids := map[string]string{} // README ID -> this run's ID
	for _, s := range steps {
		if strings.HasPrefix(s.command, "export ") {
			continue // the environment below is the export's
		}
		line := s.command
		for readme, real := range ids {
			line = strings.ReplaceAll(line, readme, real)
		}
		cmd := exec.Command("sh", "-c", line+" 2>&1")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "NEXUS_DRIVER=process", "NEXUS_STATE_DIR="+root,
			"PATH="+filepath.Dir(nexusBin)+":"+os.Getenv("PATH"))
		got := testutil.Run(t, cmd, commandWait).Stdout.String()
		var lines []string
		if got != "" {
			lines = strings.Split(strings.TrimRight(got, "\n"), "\n")
		}
		if err := matchQuickstart(s.output, lines, ids, s.ranIn, dir); err != nil {
			t.Fatalf("README quickstart `%s`: %v\nREADME shows:\n%s\nit printed:\n%s", s.command, err, strings.Join(s.output, "\n"), got)
		}
	}
}

// quickstartStep is one "$ command" of the README's console block and the
// lines shown under it.
type quickstartStep struct {
	command string
	output  []string
	ranIn   string // the directory the README's run used, from its paths
}

// quickstartSteps reads the README's one console block.
func quickstartSteps(t *testing.T, path string) []quickstartStep {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(data), "```console\n")
	if !ok {
		t.Fatalf("%s has no console block", path)
	}
	block, _, _ = strings.Cut(block, "```")
	ranIn := regexp.MustCompile(`(/tmp/[^/\s]+)/img\.raw`).FindStringSubmatch(block)
	if ranIn == nil {
		t.Fatalf("%s: no /tmp/DIR/img.raw in the console block to tell where it ran", path)
	}
	var steps []quickstartStep
	for _, line := range strings.Split(strings.TrimRight(block, "\n"), "\n") {
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			steps = append(steps, quickstartStep{command: cmd, ranIn: ranIn[1]})
		} else if len(steps) > 0 {
			steps[len(steps)-1].output = append(steps[len(steps)-1].output, line)
		}
	}
	if len(steps) < 8 {
		t.Fatalf("%s: only %d quickstart commands found: the parser is broken", path, len(steps))
	}
	return steps
}

var (
	quickstartULID = regexp.MustCompile(`^([0-9A-HJKMNP-TV-Z]{26}|[0-9a-f]{12})$`)
	quickstartAge  = regexp.MustCompile(`\b(now|\d+ (second|minute)s? ago)\b`)
	quickstartNum  = regexp.MustCompile(`\d+(\.\d+)?`)
)

// quickstartPunct is what may wrap an ID in prose: "rm of ID:", "(web)".
const quickstartPunct = "():,;."

// matchQuickstart compares the README's lines for one command with what
// it printed, binding README IDs to real ones as they first appear.
func matchQuickstart(want, got []string, ids map[string]string, ranIn, dir string) error {
	if len(want) != len(got) {
		return fmt.Errorf("%d lines, the README shows %d", len(got), len(want))
	}
	for i := range want {
		w := strings.Fields(quickstartAge.ReplaceAllString(strings.ReplaceAll(want[i], ranIn, dir), "AGO"))
		g := strings.Fields(quickstartAge.ReplaceAllString(got[i], "AGO"))
		cut := len(w) > 0 && w[len(w)-1] == "..."
		if cut {
			w = w[:len(w)-1]
		}
		if len(g) < len(w) || (!cut && len(g) != len(w)) {
			return fmt.Errorf("line %d has %d words, the README's %d", i+1, len(g), len(w))
		}
		for j := range w {
			if err := matchWord(w[j], g[j], ids); err != nil {
				return fmt.Errorf("line %d word %d: %v", i+1, j+1, err)
			}
		}
	}
	return nil
}

// matchWord compares one word: an ID binds (or must match its binding),
// and numbers compare as numbers of any value; key=ID words bind too.
func matchWord(want, got string, ids map[string]string) error {
	wk, wv, wkv := strings.Cut(want, "=")
	gk, gv, gkv := strings.Cut(got, "=")
	if wkv && gkv && wk == gk {
		want, got = wv, gv
	}
	if w, g := strings.Trim(want, quickstartPunct), strings.Trim(got, quickstartPunct); w != want && quickstartULID.MatchString(w) {
		if strings.ReplaceAll(want, w, "") != strings.ReplaceAll(got, g, "") {
			return fmt.Errorf("%q, the README shows %q", got, want)
		}
		want, got = w, g
	}
	if quickstartULID.MatchString(want) {
		if !quickstartULID.MatchString(got) || len(got) != len(want) {
			return fmt.Errorf("%q where the README shows an ID", got)
		}
		if bound, ok := ids[want]; ok && bound != got {
			return fmt.Errorf("%s where the README's %s was %s", got, want, bound)
		}
		ids[want] = got
		return nil
	}
	if quickstartNum.ReplaceAllString(want, "#") != quickstartNum.ReplaceAllString(got, "#") {
		return fmt.Errorf("%q, the README shows %q", got, want)
	}
	return nil
}
