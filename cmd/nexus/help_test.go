package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// Every command a user can run shows an example in its help.
func TestEveryCommandHasAnExample(t *testing.T) {
	t.Parallel()
	root := newRoot()
	var missing []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c != root && c.IsAvailableCommand() && c.Example == "" {
			missing = append(missing, commandKey(c))
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if len(missing) > 0 {
		t.Fatalf("commands without an example in examples.go: %v", missing)
	}
	for key := range examples {
		if c, rest, err := root.Find(strings.Fields(key)); err != nil || len(rest) > 0 || commandKey(c) != key {
			t.Errorf("examples.go has an entry for %q, which is not a command", key)
		}
	}
}

// docs man writes one page per visible command, each with its examples.
func TestDocsManWritesEveryCommand(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "man1")
	mustOK(t, nexus(t, t.TempDir(), "docs", "man", dir), "docs man")
	for _, key := range []string{"create", "volume create", "replay verify", "config show"} {
		page := filepath.Join(dir, "nexus-"+strings.ReplaceAll(key, " ", "-")+".1")
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if !strings.Contains(string(data), ".TH \"NEXUS\"") || !strings.Contains(string(data), examples[key][0]) {
			t.Errorf("%s: page lacks its header or example:\n%s", page, data)
		}
	}
	for _, hidden := range []string{"nexus-vmm-process.1", "nexus-supervisor.1"} {
		if _, err := os.Stat(filepath.Join(dir, hidden)); err == nil {
			t.Errorf("a page for the internal command %s", hidden)
		}
	}
}

// Completion offers what is in the state root: sandbox IDs and handles,
// snapshots for restore, volume names, and fixed values for flags.
func TestCompletionOffersStateRootValues(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t), "--handle", "web/1")
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	mustOK(t, proc(t, root, "volume", "create", "cache", "--size", "16M"), "volume create")
	complete := func(args ...string) []string {
		r := mustOK(t, proc(t, root, append([]string{"__complete"}, args...)...), "complete")
		var values []string
		for _, line := range strings.Split(r.stdout, "\n") {
			if line == "" || strings.HasPrefix(line, ":") {
				continue
			}
			v, _, _ := strings.Cut(line, "\t")
			values = append(values, v)
		}
		return values
	}
	has := func(what string, got []string, want ...string) {
		t.Helper()
		for _, w := range want {
			found := false
			for _, g := range got {
				found = found || g == w
			}
			if !found {
				t.Errorf("%s: %q not offered in %v", what, w, got)
			}
		}
	}
	has("inspect", complete("inspect", ""), sb.ID, "web/1")
	has("exec", complete("exec", ""), sb.ID, "web/1")
	if got := complete("exec", sb.ID, "--", ""); len(got) != 0 {
		t.Errorf("exec's command was completed with %v, want the shell's own", got)
	}
	has("restore", complete("restore", ""), snap)
	has("volume rm", complete("volume", "rm", ""), "cache")
	has("events --type", complete("events", "--type", ""), "sandbox.created", "sandbox")
	has("--driver", complete("--driver", ""), "process", "cloud-hypervisor")
	has("reap --kind", complete("reap", "--kind", ""), "raw-disk")
	// A root that does not exist is not created by completing into it.
	missing := filepath.Join(t.TempDir(), "none")
	r := mustOK(t, nexus(t, missing, "__complete", "inspect", ""), "complete in a missing root")
	if _, err := os.Stat(missing); err == nil {
		t.Fatalf("completion created the state root %s: %s", missing, r.stdout)
	}
}
