package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/lifecycle"
)

// The commands that run a sandbox's own processes exist in the CLI too,
// hidden, and hand their command line to nexusd unparsed: a supervisor or
// VMM started by hand through nexus runs as it does from nexus-shim.
func TestCLIHandsShimCommandsToNexusd(t *testing.T) {
	t.Parallel()
	if inProcess() != nil {
		t.Skip("nexusd serves these commands itself")
	}
	root := newRoot()
	for _, name := range lifecycle.ShimCommands {
		c, _, err := root.Find([]string{name})
		if err != nil || c == root || c.Name() != name {
			t.Errorf("nexus has no %s command (found %v, %v)", name, c.Name(), err)
			continue
		}
		if !c.Hidden || !c.DisableFlagParsing {
			t.Errorf("nexus %s: hidden %v, flags left to nexusd %v; want both", name, c.Hidden, c.DisableFlagParsing)
		}
	}
}

// A driver nexus does not have is refused before the command runs, as a
// usage error naming the ones it has.
func TestUnknownDriverIsAUsageError(t *testing.T) {
	t.Parallel()
	var u usageError
	err := execute(context.Background(), newRoot(), []string{"--state-dir", t.TempDir(), "--driver", "kvm", "ls"})
	if !errors.As(err, &u) || !strings.Contains(err.Error(), `--driver "kvm": want cloud-hypervisor, process or qemu`) {
		t.Fatalf("--driver kvm: %v (%T), want a usage error naming the drivers", err, err)
	}
}
