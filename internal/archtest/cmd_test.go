package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
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
	"client":             "the run id variable a client sets",
	"config":             "the config file and environment settings it shows and hands on, sizes as flags spell them",
	"control":            "connecting to a state root, the errors that map to exit codes",
	"control/wire":       "the daemon status it prints",
	"events":             "the events it prints and the query it parses",
	"host/fleetread":     "the fleet-wide reads of the aggregate, over the NATS client alone, in nexus-fleet (-tags nexusfleet) and nexusd",
	"host/fleetstate":    "the fleet mirror's state, records skipped and names it prints",
	"internal/testhooks": "failure injection, in a -tags nexustest build only",
	"layout":             "run and sandbox ids checked at parse time",
	"ledger":             "the sweep's caller and verdicts",
	"oneline":            "one-line messages",
	"projections":        "the sandboxes and volumes it prints",
	"reaper":             "the kinds a reap judges, which --kind takes",
	"replay":             "the audit it prints",
	"session":            "the flows a command runs, run, ledger sweeps and reap",
}

// cmdNexusdImports are what the files of nexusd alone (-tags nexusd: a
// name ending _nexusd.go, or nexusd.go) may import besides: the daemon,
// the store opened in process and the journal and fleet readers, which
// the CLI never links (TestCLILinksNoStore).
var cmdNexusdImports = map[string]string{
	"audit":            "replay's journal copy, mirror read and state-root scan",
	"control/local":    "the store opened in process, journal repair",
	"daemon":           "nexus daemon",
	"host/driver":      "vmm-process and vmm-qemu serve a driver's VMM command line",
	"host/initramfs":   "nexus guest initramfs builds one",
	"host/proc":        "the readiness pipe of the VMM and supervisor it serves",
	"host/qemu":        "vmm-qemu is the qemu driver's VMM",
	"host/supervisor":  "the supervisor command is the supervisor",
	"session/tracing":  "the sagas' spans, exported when the environment asks",
	"host/vmm/standin": "vmm-process is the process driver's VMM",
}

// cmdNexusFleetFiles may import host/fleet, and only they (nexusd's): the
// mirror flags, fleet template, fleet aggregate. The fleet-wide reads use
// host/fleetread, which nexus-fleet links and the CLI does not
// (TestCLILinksNoStore); host/journal, like the store, cmd/nexus never
// imports.
var cmdNexusFleetFiles = []string{"daemon_nexusd.go", "fleet_nexusd.go", "fleetread_nexusd.go"}

func nexusdFile(name string) bool {
	return name == "nexusd.go" || strings.HasSuffix(name, "_nexusd.go")
}

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
			case nexusdFile(name) && cmdNexusdImports[pkg] != "":
			case cmdNexusImports[pkg] == "":
				t.Errorf("cmd/nexus/%s imports %s: cmd/nexus parses, calls one command-facing package and prints; move what needs %s behind one", name, pkg, pkg)
			}
		}
	}
	for pkg := range cmdNexusdImports {
		if !used[pkg] {
			t.Errorf("cmd/nexus no longer imports %s: drop it from cmdNexusdImports", pkg)
		}
	}
	for pkg := range cmdNexusImports {
		if !used[pkg] {
			t.Errorf("cmd/nexus no longer imports %s: drop it from cmdNexusImports", pkg)
		}
	}
}

// TestCLILinksNoStore: the CLI (cmd/nexus built without -tags nexusd)
// and the public Go client link no store, journal, daemon, fleet adapter,
// nats-server or NATS client, whose package initialisation every command
// (and every program using the client) would pay; nexus-fleet (-tags
// nexusfleet), which runs the fleet-wide reads, links the NATS client but
// nothing else of the list. nexusd links them all, so the check is not
// blind.
func TestCLILinksNoStore(t *testing.T) {
	banned := []string{module + "store", module + "host/journal", module + "daemon", module + "control/local", module + "host/fleet", module + "audit", "github.com/nats-io/nats-server/",
		// The trace exporter and what it brings (protobuf, gRPC): a traced
		// command runs in nexusd.
		module + "session/tracing", "go.opentelemetry.io/otel/sdk/", "go.opentelemetry.io/otel/exporters/", "google.golang.org/grpc"}
	// The NATS client and what it brings (jetstream, nkeys, nuid,
	// klauspost/compress, encoding/gob through its encoders).
	natsClient := []string{"github.com/nats-io/", module + "host/fleetread", module + "host/streamscan"}
	for _, c := range []struct {
		pkg, tags string
		banned    []string
	}{
		{"./cmd/nexus", "", slices.Concat(banned, natsClient)},
		{"./cmd/nexus", "nexustest", slices.Concat(banned, natsClient)},
		{"./client", "", slices.Concat(banned, natsClient)},
		{"./cmd/nexus", "nexusfleet", banned},
	} {
		deps := goListDeps(t, c.pkg, c.tags)
		for _, d := range deps {
			for _, b := range c.banned {
				if d == b || strings.HasSuffix(b, "/") && strings.HasPrefix(d, b) {
					t.Errorf("%s (tags %q) links %s", c.pkg, c.tags, d)
				}
			}
		}
	}
	if deps := goListDeps(t, "./cmd/nexus", "nexusfleet"); !slices.Contains(deps, "github.com/nats-io/nats.go") {
		t.Error("nexus-fleet (cmd/nexus -tags nexusfleet) does not link github.com/nats-io/nats.go: the check above is blind")
	}
	deps := goListDeps(t, "./cmd/nexus", "nexusd")
	for _, want := range []string{module + "store", module + "daemon", "github.com/nats-io/nats-server/v2/server", module + "session/tracing"} {
		if !slices.Contains(deps, want) {
			t.Errorf("nexusd (cmd/nexus -tags nexusd) does not link %s: the check above is blind", want)
		}
	}
}

func goListDeps(t *testing.T, pkg, tags string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", tags, "-deps", pkg)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -tags %q -deps %s: %v", tags, pkg, err)
	}
	return strings.Fields(string(out))
}

// TestShimLinksLittle: nexus-shim, which every sandbox start spawns
// twice, links none of the CLI, the flows, the store or nats-server: its
// start is a small program's.
func TestShimLinksLittle(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/nexus-shim")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/nexus-shim: %v", err)
	}
	deps := strings.Fields(string(out))
	banned := []string{module + "lifecycle", module + "control", module + "store", module + "host/journal", module + "daemon",
		"github.com/nats-io/", "github.com/spf13/cobra", "go.etcd.io/bbolt"}
	for _, d := range deps {
		for _, b := range banned {
			if d == b || strings.HasPrefix(d, b+"/") || strings.HasSuffix(b, "/") && strings.HasPrefix(d, b) {
				t.Errorf("nexus-shim links %s", d)
			}
		}
	}
	if !slices.Contains(deps, module+"host/supervisor") {
		t.Error("nexus-shim does not link host/supervisor: the check above is blind")
	}
}

// TestCLICompilesNoPatternAtStart: no package the CLI links compiles a
// regular expression in a package-level variable or an init function,
// which every command would pay before it runs (a bounded repeat such as
// {0,61} compiles to a program that many times longer); a pattern is
// compiled on first use (sync.OnceValue) instead. nexusd, which links the
// fleet adapter's pattern, shows that the check sees one.
func TestCLICompilesNoPatternAtStart(t *testing.T) {
	if found := patternsAtStart(t, "./cmd/nexus", "nexusd"); len(found) == 0 {
		t.Error("no pattern compiled at start found in nexusd: the check is blind")
	}
	for _, c := range []struct{ pkg, tags string }{{"./cmd/nexus", ""}, {"./cmd/nexus", "nexusfleet"}, {"./client", ""}} {
		for _, at := range patternsAtStart(t, c.pkg, c.tags) {
			t.Errorf("%s (tags %q) compiles a pattern at start: %s", c.pkg, c.tags, at)
		}
	}
}

// patternsAtStart lists where the module's packages linked into pkg call
// regexp's Compile functions outside a function literal, in a
// package-level variable's value or an init function.
func patternsAtStart(t *testing.T, pkg, tags string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", tags, "-deps", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .GoFiles \" \"}}", pkg)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	var found []string
	fset := token.NewFileSet()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 || !strings.HasPrefix(f[0]+"/", module) {
			continue
		}
		for _, name := range strings.Fields(f[2]) {
			file, err := parser.ParseFile(fset, filepath.Join(f[1], name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			var roots []ast.Node
			for _, d := range file.Decls {
				switch d := d.(type) {
				case *ast.GenDecl:
					if d.Tok == token.VAR {
						roots = append(roots, d)
					}
				case *ast.FuncDecl:
					if d.Recv == nil && d.Name.Name == "init" {
						roots = append(roots, d.Body)
					}
				}
			}
			for _, r := range roots {
				ast.Inspect(r, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.FuncLit:
						return false
					case *ast.CallExpr:
						if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
							if x, ok := sel.X.(*ast.Ident); ok && x.Name == "regexp" && strings.Contains(sel.Sel.Name, "Compile") {
								found = append(found, fset.Position(n.Pos()).String())
							}
						}
					}
					return true
				})
			}
		}
	}
	return found
}
