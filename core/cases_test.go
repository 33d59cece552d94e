package core

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected outputs in testdata/ with what the code decides")

// A case file is a list of cases in the shape of raft's interaction files:
//
//	# comment
//	command key=value key="quoted value" flag
//	input line
//	----
//	expected output
//
// with a blank line after each case; the input lines (none, or as many as
// the command reads) are the command's own, say a batch of events. run
// hands each case to do and compares what it returns with the expected
// output; with -rewrite it writes the outputs back into the file instead.
type testCase struct {
	pos  string // file:line of the command
	line string
	cmd  string
	args map[string]string
	// input is the lines between the command and "----".
	input []string
	// want is the expected output; from and to are its lines in the file.
	want     string
	from, to int
}

// arg returns the value of key, and whether the case gave it.
func (c testCase) arg(key string) (string, bool) { v, ok := c.args[key]; return v, ok }

// only fails the test if the case gives an argument not in keys, or input
// lines: a misspelt argument or a stray line would otherwise be a case
// that tests something else.
func (c testCase) only(t *testing.T, keys ...string) {
	t.Helper()
	if len(c.input) > 0 {
		t.Fatalf("%s: %s reads no input lines", c.pos, c.cmd)
	}
	c.onlyArgs(t, keys...)
}

// onlyArgs is only for a command that reads input lines.
func (c testCase) onlyArgs(t *testing.T, keys ...string) {
	t.Helper()
	for k := range c.args {
		if !slices.Contains(keys, k) {
			t.Fatalf("%s: unknown argument %q (want one of %v)", c.pos, k, keys)
		}
	}
}

func runCases(t *testing.T, path string, do func(t *testing.T, c testCase) string) []testCase {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	cases := parseCases(t, path, lines)
	if len(cases) == 0 {
		t.Fatalf("%s holds no cases", path)
	}
	var out []string
	last := 0
	for _, c := range cases {
		got := strings.TrimRight(do(t, c), "\n")
		if *rewrite {
			out = append(append(out, lines[last:c.from]...), strings.Split(got, "\n")...)
			last = c.to
			continue
		}
		if got != c.want {
			t.Errorf("%s: %s\ngot:\n%s\nwant:\n%s", c.pos, c.line, got, c.want)
		}
	}
	if *rewrite {
		out = append(out, lines[last:]...)
		if err := os.WriteFile(path, []byte(strings.Join(out, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cases
}

func parseCases(t *testing.T, path string, lines []string) []testCase {
	t.Helper()
	var cases []testCase
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		pos := fmt.Sprintf("%s:%d", path, i+1)
		fields, err := splitArgs(l)
		if err != nil {
			t.Fatalf("%s: %v", pos, err)
		}
		c := testCase{pos: pos, line: l, cmd: fields[0], args: map[string]string{}}
		for _, f := range fields[1:] {
			k, v, _ := strings.Cut(f, "=")
			if strings.HasPrefix(v, `"`) {
				v, _ = strconv.Unquote(v)
			}
			if _, dup := c.args[k]; dup {
				t.Fatalf("%s: %s given twice", c.pos, k)
			}
			c.args[k] = v
		}
		for i++; i < len(lines) && lines[i] != "----"; i++ {
			if strings.TrimSpace(lines[i]) == "" {
				break
			}
			c.input = append(c.input, lines[i])
		}
		if i >= len(lines) || lines[i] != "----" {
			t.Fatalf("%s: a command and its input are followed by ----", c.pos)
		}
		c.from = i + 1
		c.to = c.from
		for c.to < len(lines) && lines[c.to] != "" {
			c.to++
		}
		c.want = strings.Join(lines[c.from:c.to], "\n")
		cases = append(cases, c)
		i = c.to
	}
	return cases
}

// splitArgs splits a command line at spaces, except inside a Go-quoted
// value (key="a b").
func splitArgs(l string) ([]string, error) {
	var out []string
	for l = strings.TrimSpace(l); l != ""; l = strings.TrimLeft(l, " \t") {
		end := strings.IndexAny(l, " \t\"")
		if end < 0 {
			out = append(out, l)
			break
		}
		if l[end] != '"' {
			out = append(out, l[:end])
			l = l[end:]
			continue
		}
		q, err := strconv.QuotedPrefix(l[end:])
		if err != nil {
			return nil, fmt.Errorf("unterminated quote in %q", l)
		}
		out = append(out, l[:end]+q)
		l = l[end+len(q):]
		if l != "" && l[0] != ' ' && l[0] != '\t' {
			return nil, fmt.Errorf("no space after the quoted value in %q", out[len(out)-1]+l)
		}
	}
	return out, nil
}
