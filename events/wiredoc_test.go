package events

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// docs/events.md documents the wire format subscribers decode. Its tables
// between these markers are checked against the Go types, key by key and
// type by type, so the document cannot drift from the codec. To rewrite
// them after changing a payload (descriptions come from the Go comments):
//
//	NEXUS_UPDATE_DOCS=1 go test ./events -run TestWireDoc
const (
	wireDoc      = "../docs/events.md"
	wireDocBegin = "<!-- BEGIN GENERATED: wire tables (events/wiredoc_test.go) -->"
	wireDocEnd   = "<!-- END GENERATED -->"
)

// wireRow is one documented msgpack key of a section.
type wireRow struct {
	Key, Type string
	Optional  bool
	Meaning   string
}

type wireSection struct {
	Title string // "envelope", "sandbox.created (schema 3)", "Resource"
	Doc   string // the Go type's comment: prose, not checked
	Rows  []wireRow
}

// msgpackType names how vmihailenco/msgpack writes a Go type: integers in
// the smallest encoding that holds the value, strings as str, []byte as bin.
func msgpackType(t reflect.Type, nested map[reflect.Type]bool) string {
	switch t.Kind() {
	case reflect.String:
		return "str"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "int"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "uint"
	case reflect.Slice:
		if t == reflect.TypeOf(msgpack.RawMessage{}) {
			return "map (payload)" // the envelope's p: decoded once t and v are known
		}
		if t.Elem().Kind() == reflect.Uint8 {
			return "bin"
		}
		return "array of " + msgpackType(t.Elem(), nested)
	case reflect.Map:
		return "map of " + msgpackType(t.Key(), nested) + " to " + msgpackType(t.Elem(), nested)
	case reflect.Struct:
		nested[t] = true
		return "map " + t.Name()
	}
	panic(fmt.Sprintf("wire doc: no msgpack name for %v", t))
}

// structRows lists t's msgpack keys in declaration order.
func structRows(t reflect.Type, comments map[string]string, nested map[reflect.Type]bool) []wireRow {
	var rows []wireRow
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("msgpack")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		rows = append(rows, wireRow{Key: name, Type: msgpackType(f.Type, nested),
			Optional: strings.Contains(opts, "omitempty"), Meaning: comments[t.Name()+"."+f.Name]})
	}
	return rows
}

// wireSections is the wire format as the Go types define it.
func wireSections(comments map[string]string) []wireSection {
	nested := map[reflect.Type]bool{}
	out := []wireSection{{Title: "envelope",
		Doc: "Every message body is this map; `p` is the payload of type `t` at schema `v`.", Rows: structRows(reflect.TypeOf(wire{}), comments, nested)}}
	types := Types()
	slices.Sort(types)
	for _, ty := range types {
		s := registry[ty]
		out = append(out, wireSection{Title: fmt.Sprintf("%s (schema %d)", ty, s.current), Doc: comments[s.zero.Name()],
			Rows: structRows(s.zero, comments, nested)})
	}
	delete(nested, reflect.TypeOf(wire{}))
	var names []reflect.Type
	for t := range nested {
		names = append(names, t)
	}
	for len(names) > 0 { // nested types may nest more types
		sort.Slice(names, func(i, j int) bool { return names[i].Name() < names[j].Name() })
		t := names[0]
		names = names[1:]
		before := len(nested)
		out = append(out, wireSection{Title: t.Name(), Doc: comments[t.Name()], Rows: structRows(t, comments, nested)})
		if len(nested) != before {
			for n := range nested {
				if !slices.ContainsFunc(out, func(s wireSection) bool { return s.Title == n.Name() }) && !slices.Contains(names, n) {
					names = append(names, n)
				}
			}
		}
	}
	return out
}

// goComments maps "Type.Field" to the field's comment in the events
// package's sources, for the meaning column of a generated table.
func goComments(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]string{}
	for _, file := range []string{"payloads.go", "codec.go"} {
		f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if gd, ok := n.(*ast.GenDecl); ok && gd.Tok == token.TYPE && len(gd.Specs) == 1 && gd.Doc != nil {
				out[gd.Specs[0].(*ast.TypeSpec).Name.Name] = strings.Join(strings.Fields(gd.Doc.Text()), " ")
			}
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, fld := range st.Fields.List {
				text := ""
				for _, g := range []*ast.CommentGroup{fld.Doc, fld.Comment} {
					if g != nil {
						text = strings.TrimSpace(text + " " + g.Text())
					}
				}
				text = strings.Join(strings.Fields(strings.ReplaceAll(text, "|", "/")), " ")
				for _, name := range fld.Names {
					out[ts.Name.Name+"."+name.Name] = text
				}
			}
			return true
		})
	}
	return out
}

func renderWire(sections []wireSection) string {
	var b strings.Builder
	for _, s := range sections {
		fmt.Fprintf(&b, "\n### %s\n\n", s.Title)
		if s.Doc != "" {
			fmt.Fprintf(&b, "%s\n\n", s.Doc)
		}
		fmt.Fprintf(&b, "| key | msgpack type | omitted when empty | meaning |\n| --- | --- | --- | --- |\n")
		for _, r := range s.Rows {
			opt := "no"
			if r.Optional {
				opt = "yes"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.Key, r.Type, opt, r.Meaning)
		}
	}
	return b.String() + "\n"
}

var (
	headingRE = regexp.MustCompile("^### (.+)$")
	rowRE     = regexp.MustCompile("^\\| `([^`]+)` \\| ([^|]+?) \\| (yes|no) \\|")
)

// parseWire reads the sections back from the document's tables, ignoring
// the meaning column, which is prose.
func parseWire(text string) []wireSection {
	var out []wireSection
	for _, line := range strings.Split(text, "\n") {
		if m := headingRE.FindStringSubmatch(line); m != nil {
			out = append(out, wireSection{Title: m[1]})
			continue
		}
		if m := rowRE.FindStringSubmatch(line); m != nil && len(out) > 0 {
			s := &out[len(out)-1]
			s.Rows = append(s.Rows, wireRow{Key: m[1], Type: m[2], Optional: m[3] == "yes"})
		}
	}
	return out
}

func TestWireDocMatchesTypes(t *testing.T) {
	data, err := os.ReadFile(wireDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	begin, end := strings.Index(doc, wireDocBegin), strings.Index(doc, wireDocEnd)
	if begin < 0 || end < begin {
		t.Fatalf("%s: no %q ... %q region", wireDoc, wireDocBegin, wireDocEnd)
	}
	want := wireSections(goComments(t))
	if os.Getenv("NEXUS_UPDATE_DOCS") == "1" {
		doc = doc[:begin+len(wireDocBegin)] + "\n" + renderWire(want) + doc[end:]
		if err := os.WriteFile(wireDoc, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got := parseWire(doc[begin:end])
	index := map[string]wireSection{}
	for _, s := range got {
		index[s.Title] = s
	}
	const hint = " (NEXUS_UPDATE_DOCS=1 go test ./events -run TestWireDoc rewrites the tables)"
	for _, w := range want {
		g, ok := index[w.Title]
		if !ok {
			t.Errorf("%s: no section %q%s", wireDoc, w.Title, hint)
			continue
		}
		delete(index, w.Title)
		for i := range max(len(w.Rows), len(g.Rows)) {
			var wr, gr wireRow
			if i < len(w.Rows) {
				wr = w.Rows[i]
				wr.Meaning = ""
			}
			if i < len(g.Rows) {
				gr = g.Rows[i]
			}
			if wr != gr {
				t.Errorf("%s, %s, row %d: documents %+v, the Go type has %+v%s", wireDoc, w.Title, i+1, gr, wr, hint)
			}
		}
	}
	for title := range index {
		t.Errorf("%s documents section %q, which the Go types do not have%s", wireDoc, title, hint)
	}
}

// TestWireDocParserSeesDrift: the check above fails on a renamed key, a
// changed type, a lost omitempty and an unknown section, not only on a
// missing one.
func TestWireDocParserSeesDrift(t *testing.T) {
	want := wireSections(map[string]string{"wire": "The envelope."})
	text := renderWire(want)
	for i := range want {
		want[i].Doc = "" // prose: not read back
	}
	if got := parseWire(text); !reflect.DeepEqual(got, want) {
		t.Fatalf("rendered tables do not parse back to the sections")
	}
	for _, edit := range [][2]string{
		{"| `pid` | int |", "| `vmm_pid` | int |"},
		{"| `allocated` | int |", "| `allocated` | uint |"},
		{"| `handle` | str | yes |", "| `handle` | str | no |"},
		{"### envelope", "### envelopes"},
	} {
		if !strings.Contains(text, edit[0]) {
			t.Fatalf("no %q in the rendered tables", edit[0])
		}
		if reflect.DeepEqual(parseWire(strings.Replace(text, edit[0], edit[1], 1)), want) {
			t.Errorf("an edit %q -> %q goes unseen", edit[0], edit[1])
		}
	}
}

// TestEncodedEventsHaveTheDocumentedKeys decodes real encoded events with a
// generic msgpack decoder, as a subscriber in another language would, and
// finds exactly the documented keys: every required one, no other.
func TestEncodedEventsHaveTheDocumentedKeys(t *testing.T) {
	sections := map[string]wireSection{}
	for _, s := range wireSections(map[string]string{}) {
		sections[strings.Fields(s.Title)[0]] = s
	}
	check := func(what string, m map[string]any, s wireSection) {
		t.Helper()
		for _, r := range s.Rows {
			if _, ok := m[r.Key]; !ok && !r.Optional {
				t.Errorf("%s: required key %q missing", what, r.Key)
			}
			delete(m, r.Key)
		}
		for k := range m {
			t.Errorf("%s: key %q is not documented", what, k)
		}
	}
	for _, p := range samples {
		e := New(testID, testTime, testSandbox, p).InSaga("01J0000000000000000000SAGA", "step")

		data, err := Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := msgpack.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		payload, ok := m["p"].(map[string]any)
		if !ok {
			t.Fatalf("%s: p is %T, not a map", e.Type, m["p"])
		}
		if id, ok := m["id"].([]byte); !ok || len(id) != 16 {
			t.Errorf("%s: id is %T %v, not 16 bytes", e.Type, m["id"], m["id"])
		}
		check(string(e.Type)+" envelope", m, sections["envelope"])
		check(string(e.Type)+" payload", payload, sections[string(e.Type)])
	}
}

// The Subjects section's token examples and per-volume filter are what
// the encoders produce, and each of the two own tokens is documented.
func TestWireDocSubjects(t *testing.T) {
	data, err := os.ReadFile(wireDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	section := doc[strings.Index(doc, "## Subjects"):strings.Index(doc, "## Sequence")]
	section = strings.Join(strings.Fields(section), " ")
	encode := map[string]func(string) string{"h_": HandleToken, "v_": VolumeToken}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile("`([^`]+)` is `([hv]_[^`]+)`").FindAllStringSubmatch(section, -1) {
		prefix := m[2][:2]
		seen[prefix] = true
		if got := encode[prefix](m[1]); got != m[2] {
			t.Errorf("%s: %q is documented as %s, encoded as %s", wireDoc, m[1], m[2], got)
		}
	}
	if !seen["h_"] || !seen["v_"] {
		t.Errorf("%s: Subjects gives no example of a handle's or a volume's token (%v)", wireDoc, seen)
	}
	if filter := strings.Replace(VolumeSubjects("NAME"), VolumeToken("NAME"), "v_<name>", 1); !strings.Contains(section, "`"+filter+"`") {
		t.Errorf("%s: Subjects does not give a volume's filter as %s", wireDoc, filter)
	}
}
