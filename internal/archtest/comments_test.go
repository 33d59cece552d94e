package archtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// historyInComments are the marks of history in a comment: a requirement
// code, an issue number, a test cited as a reason, a load figure. A comment
// says what the code does and why; where a rule came from lives in git and
// in docs/requirements.md.
var historyInComments = []struct {
	what string
	re   *regexp.Regexp
}{
	{"requirement code", regexp.MustCompile(`\bRL-[0-9]`)},
	{"issue number", regexp.MustCompile(`\b[Ii]ssues? #?[0-9]`)},
	{"issue reference", regexp.MustCompile(`(^|[\s(\[,])#[0-9]+\b`)},
	{"test name", regexp.MustCompile(`\b(Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*`)},
	{"load figure", regexp.MustCompile(`\bat load [0-9]|\bload (of )?[0-9]+\b`)},
}

// testNamesAllowed are test-machinery names a production comment may use.
var testNamesAllowed = map[string]bool{"TestMain": true}

// TestCommentsCarryNoHistory parses every non-test Go file of the module
// and fails on each comment line that carries history.
func TestCommentsCarryNoHistory(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		rel, _ := filepath.Rel(root, path)
		for _, group := range f.Comments {
			for _, c := range group.List {
				for i, line := range strings.Split(c.Text, "\n") {
					if what := history(line); what != "" {
						t.Errorf("%s:%d: comment carries history (%s); say what and why instead: %s",
							rel, fset.Position(c.Pos()).Line+i, what, strings.TrimSpace(line))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("found only %d non-test Go files under %s", files, root)
	}
}

// history names the first mark of history in line, or "".
func history(line string) string {
	for _, h := range historyInComments {
		for _, m := range h.re.FindAllString(line, -1) {
			if !testNamesAllowed[m] {
				return h.what
			}
		}
	}
	return ""
}

// TestHistoryPatterns pins what the comment rule catches and what it lets
// through.
func TestHistoryPatterns(t *testing.T) {
	for line, want := range map[string]string{
		"// RL-9: ambiguity keeps":                                      "requirement code",
		"// keeps what it might cover (RL-13).":                         "requirement code",
		"// refused (issue 15, item 5)":                                 "issue number",
		"// Issue 21's structural O(1) test":                            "issue number",
		"// fixes #21":                                                  "issue reference",
		"// TestCrashDuringFork left one behind":                        "test name",
		"// it did, at load 30":                                         "load figure",
		"// A journal that cannot be read fully is ambiguity: keep it.": "",
		"// saga (name, name#2, ...), its de-duplication id":            "",
		"// for a TestMain's end":                                       "",
		"// <saga>.<step>[#N]: #N matches the N-th time only":           "",
		"// on a loaded machine a start can take seconds":               "",
	} {
		if got := history(line); got != want {
			t.Errorf("history(%q) = %q, want %q", line, got, want)
		}
	}
}
