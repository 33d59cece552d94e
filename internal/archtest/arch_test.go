package archtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/nexus-sandbox/nexus/"

// externals are the names the picture may draw that are not nexus
// packages, and the import path each stands for.
var externals = map[string]string{"nats-server": "github.com/nats-io/nats-server/"}

// testsSource is the picture's name for "some package's tests": an arrow
// from it is checked against test imports.
const testsSource = "tests"

// graph is the module's import graph: for each package (path relative to
// the module), what its code imports and what its tests import.
type graph struct {
	imports, testImports map[string][]string
}

// graphOut is go list's answer, asked once for every test that reads the
// graph (each go list of the module costs seconds of CPU).
var graphOut = sync.OnceValues(func() ([]byte, error) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports " "}}|{{join .TestImports " "}} {{join .XTestImports " "}}`, "./...")
	cmd.Dir = "../.."
	return cmd.Output()
})

func loadGraph(t *testing.T) graph {
	t.Helper()
	out, err := graphOut()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	g := graph{imports: map[string][]string{}, testImports: map[string][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), "|", 3)
		if len(parts) != 3 {
			t.Fatalf("go list line %q", sc.Text())
		}
		pkg := strings.TrimPrefix(parts[0], module)
		g.imports[pkg] = strings.Fields(parts[1])
		g.testImports[pkg] = strings.Fields(parts[2])
	}
	if len(g.imports) < 10 {
		t.Fatalf("go list found only %d packages", len(g.imports))
	}
	return g
}

// importsName reports whether from's code imports to (a picture name).
func (g graph) importsName(from, to string) bool {
	for _, imp := range g.imports[from] {
		if imp == module+to || externals[to] != "" && strings.HasPrefix(imp, externals[to]) {
			return true
		}
	}
	return false
}

func (g graph) testedBy(to string) bool {
	for _, imps := range g.testImports {
		if slices.Contains(imps, module+to) {
			return true
		}
	}
	return false
}

func readDoc(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

var tableRow = regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")

// tablePackages lists the first column of ARCHITECTURE.md's package table.
func tablePackages(doc string) []string {
	var out []string
	for _, m := range tableRow.FindAllStringSubmatch(doc, -1) {
		out = append(out, strings.TrimSuffix(m[1], "/"))
	}
	return out
}

// picture is the first fenced block of ARCHITECTURE.md.
func picture(t *testing.T, doc string) []string {
	t.Helper()
	start := strings.Index(doc, "```\n")
	if start < 0 {
		t.Fatal("ARCHITECTURE.md has no picture")
	}
	rest := doc[start+4:]
	end := strings.Index(rest, "```")
	if end < 0 {
		t.Fatal("ARCHITECTURE.md's picture is not closed")
	}
	return strings.Split(strings.TrimRight(rest[:end], "\n"), "\n")
}

type arrow struct{ from, to string }

const arrowHead = "──►"

var name = regexp.MustCompile(`^[a-z][a-z0-9/_.-]*`)

// arrows parses the picture: on each line, "A ──► B" draws A to B, a
// comma list "──► B, C" draws one arrow to each, a chain "A ──► B ──► C"
// also draws B to C, and a branch "├──► B" or "└──► B" starts at the
// package that spans the branch's column on the nearest line above.
func arrows(t *testing.T, lines []string) ([]arrow, map[string]bool) {
	t.Helper()
	rows := make([][]rune, len(lines))
	for i, l := range lines {
		rows[i] = []rune(l)
	}
	head := []rune(arrowHead)
	// spans[i] maps each column of line i inside a name to that name.
	spans := make([]map[int]string, len(rows))
	for i, r := range rows {
		spans[i] = map[int]string{}
		for c := 0; c < len(r); {
			if c == 0 || r[c-1] == ' ' || r[c-1] == ',' {
				if m := name.FindString(string(r[c:])); m != "" {
					for k := 0; k < len([]rune(m)); k++ {
						spans[i][c+k] = m
					}
					c += len([]rune(m))
					continue
				}
			}
			c++
		}
	}
	var out []arrow
	seen := map[string]bool{}
	for i, r := range rows {
		for c := 0; c+len(head) <= len(r); c++ {
			if string(r[c:c+len(head)]) != arrowHead {
				continue
			}
			// The source: the name just before the arrow, or the name above
			// a branch.
			b := c - 1
			for b >= 0 && r[b] == ' ' {
				b--
			}
			var from string
			switch {
			case b >= 0 && (r[b] == '├' || r[b] == '└') && b == c-1:
				for up := i - 1; up >= 0 && from == ""; up-- {
					from = spans[up][b]
				}
			case b >= 0:
				from = spans[i][b]
			}
			if from == "" {
				t.Fatalf("picture line %d: an arrow at column %d starts at no package:\n%s", i+1, c, lines[i])
			}
			// The targets: a name, or a comma list of names.
			p := c + len(head)
			for {
				for p < len(r) && r[p] == ' ' {
					p++
				}
				to := name.FindString(string(r[p:]))
				if to == "" {
					t.Fatalf("picture line %d: an arrow at column %d points at no package:\n%s", i+1, c, lines[i])
				}
				out = append(out, arrow{from, to})
				seen[from], seen[to] = true, true
				p += len([]rune(to))
				if p < len(r) && r[p] == ',' {
					p++
					continue
				}
				break
			}
		}
	}
	return out, seen
}

func TestTableListsEveryPackage(t *testing.T) {
	g := loadGraph(t)
	table := tablePackages(readDoc(t))
	for pkg := range g.imports {
		if !slices.Contains(table, pkg) {
			t.Errorf("package %s has no row in ARCHITECTURE.md's table", pkg)
		}
	}
	for _, pkg := range table {
		if !g.isPackage(pkg) {
			t.Errorf("ARCHITECTURE.md's table lists %s, which is not a package", pkg)
		}
	}
}

func TestPictureArrowsAreImports(t *testing.T) {
	g := loadGraph(t)
	drawn, _ := arrows(t, picture(t, readDoc(t)))
	if len(drawn) < 10 {
		t.Fatalf("only %d arrows parsed from the picture", len(drawn))
	}
	for _, a := range drawn {
		switch {
		case a.from == testsSource:
			if !g.testedBy(a.to) {
				t.Errorf("picture: no test imports %s", a.to)
			}
		case !g.isPackage(a.from):
			t.Errorf("picture: %s is not a package", a.from)
		case !g.importsName(a.from, a.to):
			if g.importsName(a.to, a.from) {
				t.Errorf("picture: the arrow %s ──► %s points the wrong way", a.from, a.to)
			} else {
				t.Errorf("picture: %s does not import %s", a.from, a.to)
			}
		}
	}
}

// TestTableImportsAreExact holds each row's imports column to what the
// package's code imports from the module: an import missing from the
// column fails, and so does one the column names that the code no longer
// makes.
func TestTableImportsAreExact(t *testing.T) {
	g := loadGraph(t)
	rows := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|[^|]*\\|([^|]*)\\|[^|]*\\|$").FindAllStringSubmatch(readDoc(t), -1)
	if len(rows) < 10 {
		t.Fatalf("only %d rows with an imports column in ARCHITECTURE.md's table", len(rows))
	}
	for _, m := range rows {
		pkg := strings.TrimSuffix(m[1], "/")
		var drawn []string
		for _, f := range strings.Split(m[2], ",") {
			if f = strings.TrimSpace(f); f != "" {
				drawn = append(drawn, f)
			}
		}
		var real []string
		for _, imp := range g.imports[pkg] {
			if p, ok := strings.CutPrefix(imp, module); ok {
				real = append(real, p)
			}
		}
		slices.Sort(drawn)
		slices.Sort(real)
		for _, r := range real {
			if !slices.Contains(drawn, r) {
				t.Errorf("ARCHITECTURE.md: %s imports %s, missing from its row", pkg, r)
			}
		}
		for _, d := range drawn {
			if !slices.Contains(real, d) {
				t.Errorf("ARCHITECTURE.md: %s's row names %s, which it does not import", pkg, d)
			}
		}
	}
}

func (g graph) isPackage(pkg string) bool {
	_, ok := g.imports[pkg]
	return ok
}

// The parser itself: a wrong arrow, a branch's source, a comma list.
func TestArrowsParse(t *testing.T) {
	lines := []string{
		"a ──► b ──► c, d",
		"│     └──► e",
		"└──► f",
	}
	got, _ := arrows(t, lines)
	want := []arrow{{"a", "b"}, {"b", "c"}, {"b", "d"}, {"b", "e"}, {"a", "f"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("arrows = %v, want %v", got, want)
	}
}

// lifecycle, where every flow change lands, reaches the journal only
// through the Backend it declares: neither control, node, the journal nor
// NATS may be in its closure, so its tests need no daemon and no store.
func TestLifecycleDoesNotDependOnTheJournal(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./lifecycle")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"sagas") {
		t.Fatalf("go list -deps ./lifecycle misses sagas: %v", deps)
	}
	for _, d := range deps {
		for _, banned := range []string{module + "control", module + "store", module + "host/journal", "github.com/nats-io/"} {
			if d == banned || strings.HasPrefix(d, banned) && strings.HasSuffix(banned, "/") {
				t.Errorf("lifecycle depends on %s", d)
			}
		}
	}
}

// core holds the decisions, so it does no I/O: it imports no nexus package
// but those ARCHITECTURE.md's table calls pure ("yes"), nothing outside
// the module and the standard library, and nothing of the standard library
// that reaches the host (files, processes, sockets, the clock's source of
// randomness).
func TestCoreImportsOnlyPurePackages(t *testing.T) {
	g := loadGraph(t)
	pure := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|.*\\| yes \\|$").FindAllStringSubmatch(readDoc(t), -1) {
		pure[strings.TrimSuffix(m[1], "/")] = true
	}
	if !pure["core"] || !pure["events"] {
		t.Fatalf("ARCHITECTURE.md's table marks neither core nor events pure: %v", pure)
	}
	banned := []string{"os", "io/fs", "io/ioutil", "net", "syscall", "math/rand", "crypto/rand", "runtime", "unsafe", "plugin"}
	imps := g.imports["core"]
	if len(imps) == 0 {
		t.Fatal("go list reports no imports of core")
	}
	for _, imp := range imps {
		switch pkg, ours := strings.CutPrefix(imp, module); {
		case ours:
			if !pure[pkg] {
				t.Errorf("core imports %s, which ARCHITECTURE.md's table does not call pure", pkg)
			}
		case strings.Contains(strings.SplitN(imp, "/", 2)[0], "."):
			t.Errorf("core imports %s, from outside the module and the standard library", imp)
		default:
			for _, b := range banned {
				if imp == b || strings.HasPrefix(imp, b+"/") {
					t.Errorf("core imports %s, which reaches the host", imp)
				}
			}
		}
	}
}

// policy are the packages that decide what nexus allows; the adapters
// under host/ gather evidence and carry out effects for them, and so
// import none of them, directly or through another package.
var policy = []string{"core", "projections", "reaper", "ledger", "sagas", "lifecycle", "session", "store", "control", "replay"}

// adapterPolicyImports are the adapters that still reach policy, each with
// the policy packages in its closure. An entry that no longer holds fails
// the test, so it is removed with the import it excuses.
var adapterPolicyImports = map[string][]string{
	"host/ledger":   {"ledger"},
	"host/liveness": {"ledger", "projections", "reaper"},
	"host/scan":     {"projections", "reaper"},
}

func TestAdaptersImportNoPolicy(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Deps " "}}`, "./host/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, "|")
		pkg = strings.TrimPrefix(pkg, module)
		seen++
		var reached []string
		for _, d := range strings.Fields(deps) {
			if p := strings.TrimPrefix(d, module); p != d && slices.Contains(policy, p) {
				reached = append(reached, p)
			}
		}
		slices.Sort(reached)
		if want := adapterPolicyImports[pkg]; !slices.Equal(reached, want) {
			t.Errorf("%s reaches policy %v, excused %v", pkg, reached, want)
		}
	}
	if seen < 10 {
		t.Fatalf("go list found only %d packages under host/", seen)
	}
}
