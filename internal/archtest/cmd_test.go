package archtest

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// cmdNexusImports are the nexus packages cmd/nexus may import, each with
// why: the command-facing packages it calls one function of, the types it
// prints, and the few adapters that are the command themselves. No store,
// no journal, no saga runner, no policy: those sit behind the packages
// listed here. An entry that no file imports any more fails the test, so
// it goes with the import it allowed.
var cmdNexusImports = map[string]string{
	"audit":              "replay's journal copy, mirror read and state-root scan",
	"client":             "the run id variable a client sets",
	"control":            "connecting to a state root, journal repair, the errors that map to exit codes",
	"control/wire":       "the daemon status it prints",
	"daemon":             "nexus daemon",
	"events":             "the events it prints and the query it parses",
	"host/driver":        "driver names, flags and defaults",
	"host/initramfs":     "nexus guest initramfs builds one",
	"host/ledger":        "the run outcomes it prints",
	"host/qemu":          "nexus vmm-qemu is the qemu driver's VMM",
	"host/supervisor":    "the hidden supervisor command is the supervisor",
	"host/vmm/standin":   "nexus vmm-process is the process driver's VMM",
	"internal/testhooks": "failure injection, in a -tags nexustest build only",
	"layout":             "run and sandbox ids checked at parse time",
	"ledger":             "the sweep's caller and verdicts",
	"lifecycle":          "the flows",
	"oneline":            "one-line messages",
	"projections":        "the sandboxes and volumes it prints",
	"replay":             "the audit it prints",
	"session":            "run, ledger sweeps and reap",
}

// cmdNexusFleetFiles may import host/fleet, and only they: mirror flags,
// fleet status and template, fleet reads. The fleet commands dial the
// fleet through that adapter until they have a command-facing package of
// their own; host/journal, like the store, cmd/nexus never imports.
var cmdNexusFleetFiles = []string{"commands.go", "fleet.go", "fleetread.go"}

// cmdNexusImportsOf lists, file by file, the nexus packages cmd/nexus's
// code imports (test files aside), under every build tag: the files are
// parsed, not built, so the -tags nexustest files count too.
func cmdNexusImportsOf(t *testing.T) map[string][]string {
	t.Helper()
	dir := filepath.Join("..", "..", "cmd", "nexus")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if pkg, ours := strings.CutPrefix(path, module); ours {
				out[name] = append(out[name], pkg)
			}
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d files of cmd/nexus import a nexus package", len(out))
	}
	return out
}

func TestCmdNexusImportsOnlyCommandFacingPackages(t *testing.T) {
	used := map[string]bool{}
	files := cmdNexusImportsOf(t)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, pkg := range files[name] {
			used[pkg] = true
			switch {
			case pkg == "host/fleet":
				if !slices.Contains(cmdNexusFleetFiles, name) {
					t.Errorf("cmd/nexus/%s imports host/fleet: only the fleet commands' files may", name)
				}
			case cmdNexusImports[pkg] == "":
				t.Errorf("cmd/nexus/%s imports %s: cmd/nexus parses, calls one command-facing package and prints; move what needs %s behind one", name, pkg, pkg)
			}
		}
	}
	for pkg := range cmdNexusImports {
		if !used[pkg] {
			t.Errorf("cmd/nexus no longer imports %s: drop it from cmdNexusImports", pkg)
		}
	}
}
