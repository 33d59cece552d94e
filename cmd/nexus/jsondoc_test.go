package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/host/imagecache"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/ledger"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/replay"
)

// jsonResources are the shapes docs/json.md documents, by the name of its
// section: every --json output is one of them or a list of one.
var jsonResources = map[string]reflect.Type{
	"Sandbox":           reflect.TypeFor[jsonSandbox](),
	"Process":           reflect.TypeFor[jsonProcess](),
	"Boot":              reflect.TypeFor[jsonBoot](),
	"Attachment":        reflect.TypeFor[jsonAttachment](),
	"Condition":         reflect.TypeFor[jsonCondition](),
	"Resource":          reflect.TypeFor[events.Resource](),
	"Removed":           reflect.TypeFor[lifecycle.Removed](),
	"Snapshot":          reflect.TypeFor[lifecycle.SnapshotInfo](),
	"SnapshotTaken":     reflect.TypeFor[snapshotTaken](),
	"Volume":            reflect.TypeFor[projections.Volume](),
	"VolumePruneReport": reflect.TypeFor[lifecycle.PruneReport](),
	"CacheEntry":        reflect.TypeFor[lifecycle.CacheListing](),
	"CachePruneReport":  reflect.TypeFor[lifecycle.CachePruneReport](),
	"CacheKept":         reflect.TypeFor[lifecycle.KeptEntry](),
	"CacheSkipped":      reflect.TypeFor[imagecache.Skipped](),
	"ReapReport":        reflect.TypeFor[lifecycle.ReapReport](),
	"ReapItem":          reflect.TypeFor[lifecycle.ReapItem](),
	"RecoverReport":     reflect.TypeFor[lifecycle.RecoverReport](),
	"RecoverSkipped":    reflect.TypeFor[lifecycle.Skipped](),
	"LedgerRun":         reflect.TypeFor[ledger.Outcome](),
	"Event":             reflect.TypeFor[jsonEvent](),
	"Setting":           reflect.TypeFor[config.Setting](),
	"MirrorState":       reflect.TypeFor[fleet.MirrorState](),
	"FailedCheck":       reflect.TypeFor[fleet.FailedCheck](),
	"RepairReport":      reflect.TypeFor[journal.RepairReport](),
	"Version":           reflect.TypeFor[versionInfo](),
	"DaemonStatus":      reflect.TypeFor[daemonStatus](),
	"DaemonStopped":     reflect.TypeFor[daemonStopped](),
	"Build":             reflect.TypeFor[wire.Build](),
	"ReplayEntry":       reflect.TypeFor[replay.Entry](),
	"FleetEntry":        reflect.TypeFor[replay.FleetEntry](),
	"FleetFound":        reflect.TypeFor[replay.Found](),
	"ReplayState":       reflect.TypeFor[jsonReplayState](),
	"OwnedPath":         reflect.TypeFor[projections.OwnedPath](),
	"OpenSaga":          reflect.TypeFor[projections.OpenSaga](),
	"VerifyReport":      reflect.TypeFor[replay.Report](),
	"Divergence":        reflect.TypeFor[replay.Divergence](),
	"MissingResource":   reflect.TypeFor[replay.Missing](),
	"ReapedOwned":       reflect.TypeFor[replay.ReapedOwned](),
}

type docField struct {
	name, template, typ, present, meaning string
}

// jsonFields are a struct's JSON fields as the encoder sees them.
func jsonFields(t reflect.Type) []docField {
	var out []docField
	for _, f := range structFields(t) {
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		present := "always"
		if slices.Contains(strings.Split(opts, ","), "omitempty") {
			present = "when set"
		}
		out = append(out, docField{name: name, template: "." + f.Name, typ: docType(f.Type), present: present})
	}
	return out
}

// structFields are the fields of t the encoder writes, in order: an
// untagged embedded struct's fields in its place (as encoding/json
// flattens them; a template reaches them by the same promoted names).
func structFields(t reflect.Type) []reflect.StructField {
	var out []reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if !f.IsExported() || tag == "-" {
			continue
		}
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			out = append(out, structFields(f.Type)...)
			continue
		}
		out = append(out, f)
	}
	return out
}

// docType is a Go type in docs/json.md's words.
func docType(t reflect.Type) string {
	if t == timeType {
		return "time"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return docType(t.Elem()) + " or null"
	case reflect.Slice:
		elem := t.Elem()
		if elem.Kind() == reflect.Pointer {
			elem = elem.Elem() // a list of pointers never holds a null
		}
		return "list of " + docType(elem)
	case reflect.Struct:
		for name, rt := range jsonResources {
			if rt == t {
				return name
			}
		}
		return "undocumented " + t.String()
	case reflect.Interface, reflect.Map:
		return "object"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	}
	return "unknown " + t.String()
}

// readJSONDoc parses docs/json.md: "## Name" sections, each with a table
// of | `field` | `.Template` | type | present | meaning |.
func readJSONDoc(t *testing.T) map[string][]docField {
	t.Helper()
	data, err := os.ReadFile("../../docs/json.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string][]docField{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "## "); ok {
			section = strings.Fields(name)[0]
			if _, dup := doc[section]; dup {
				t.Fatalf("docs/json.md: section %s twice", section)
			}
			doc[section] = nil
			continue
		}
		if section == "" || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 5 {
			t.Fatalf("docs/json.md %s: row %q: want 5 cells", section, line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		doc[section] = append(doc[section], docField{strings.Trim(cells[0], "`"), strings.Trim(cells[1], "`"), cells[2], cells[3], cells[4]})
	}
	return doc
}

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// TestJSONDocMatchesTypes: docs/json.md lists every field of every shape
// with the Go type's name, type and presence, each with a meaning, and the
// shapes keep the rules: snake_case, lists always present, sizes *_bytes.
func TestJSONDocMatchesTypes(t *testing.T) {
	doc := readJSONDoc(t)
	var names []string
	for name := range jsonResources {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fields, ok := doc[name]
		if !ok {
			t.Errorf("docs/json.md has no section %s", name)
			continue
		}
		want := jsonFields(jsonResources[name])
		for i, f := range want {
			if i >= len(fields) {
				t.Errorf("docs/json.md %s: missing | `%s` | `%s` | %s | %s |", name, f.name, f.template, f.typ, f.present)
				continue
			}
			got := fields[i]
			if got != (docField{f.name, f.template, f.typ, f.present, got.meaning}) {
				t.Errorf("docs/json.md %s row %d: | `%s` | `%s` | %s | %s |, want | `%s` | `%s` | %s | %s |", name, i+1,
					got.name, got.template, got.typ, got.present, f.name, f.template, f.typ, f.present)
			}
			if got.meaning == "" {
				t.Errorf("docs/json.md %s.%s: no meaning", name, f.name)
			}
			if !snakeCase.MatchString(f.name) {
				t.Errorf("%s.%s: not snake_case", name, f.name)
			}
			if strings.HasPrefix(f.typ, "list of") && f.present != "always" {
				t.Errorf("%s.%s: a list is always present ([] when empty), never omitted", name, f.name)
			}
			if f.typ == "integer" && regexp.MustCompile(`size|allocated|apparent|bytes`).MatchString(f.name) && !strings.HasSuffix(f.name, "_bytes") {
				t.Errorf("%s.%s: a size is named *_bytes", name, f.name)
			}
		}
		if len(fields) > len(want) {
			t.Errorf("docs/json.md %s: %d rows, the type has %d fields", name, len(fields), len(want))
		}
	}
	for name := range doc {
		if _, ok := jsonResources[name]; !ok {
			t.Errorf("docs/json.md section %s names no shape the test knows", name)
		}
	}
}

// checkJSON checks a JSON value against the Go type it claims to be: every
// key a field, every always-present field there, lists never null, times
// RFC 3339 in UTC, integers whole.
func checkJSON(t *testing.T, where string, typ reflect.Type, raw json.RawMessage) {
	t.Helper()
	s := strings.TrimSpace(string(raw))
	if typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Interface {
		if s == "null" {
			return
		}
		if typ.Kind() == reflect.Interface {
			if !strings.HasPrefix(s, "{") {
				t.Errorf("%s: want an object, got %s", where, s)
			}
			return
		}
		typ = typ.Elem()
	}
	switch {
	case typ == timeType:
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Errorf("%s: time %s is not a string", where, s)
			return
		}
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil || !strings.HasSuffix(v, "Z") {
			t.Errorf("%s: time %q is not RFC 3339 UTC", where, v)
		}
	case typ.Kind() == reflect.Slice:
		var items []json.RawMessage
		if !strings.HasPrefix(s, "[") || json.Unmarshal(raw, &items) != nil {
			t.Errorf("%s: want a list ([] when empty), got %s", where, s)
			return
		}
		for i, it := range items {
			checkJSON(t, fmt.Sprintf("%s[%d]", where, i), typ.Elem(), it)
		}
	case typ.Kind() == reflect.Struct:
		var obj map[string]json.RawMessage
		if !strings.HasPrefix(s, "{") || json.Unmarshal(raw, &obj) != nil {
			t.Errorf("%s: want an object, got %s", where, s)
			return
		}
		fields := map[string]bool{}
		for i, f := range jsonFields(typ) {
			fields[f.name] = true
			v, ok := obj[f.name]
			if !ok {
				if f.present == "always" {
					t.Errorf("%s: field %s missing", where, f.name)
				}
				continue
			}
			checkJSON(t, where+"."+f.name, fieldType(typ, i), v)
		}
		for k := range obj {
			if !fields[k] {
				t.Errorf("%s: field %s is not documented", where, k)
			}
		}
	case typ.Kind() == reflect.String:
		if !strings.HasPrefix(s, `"`) {
			t.Errorf("%s: want a string, got %s", where, s)
		}
	case typ.Kind() == reflect.Bool:
		if s != "true" && s != "false" {
			t.Errorf("%s: want a boolean, got %s", where, s)
		}
	case docType(typ) == "integer":
		if !regexp.MustCompile(`^-?[0-9]+$`).MatchString(s) {
			t.Errorf("%s: want an integer, got %s", where, s)
		}
	}
}

// fieldType is the type of the i-th JSON field of struct t.
func fieldType(t reflect.Type, i int) reflect.Type { return jsonField(t, i).Type }

// goFieldName is the name --format uses for the i-th JSON field of t.
func goFieldName(t reflect.Type, i int) string { return jsonField(t, i).Name }

func jsonField(t reflect.Type, i int) reflect.StructField { return structFields(t)[i] }

// TestEveryJSONOutputMatchesTheDoc runs every command that prints JSON on
// a populated state root and checks each output against its documented
// shape.
func TestEveryJSONOutputMatchesTheDoc(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	image := makeImage(t)
	list := func(name string) reflect.Type { return reflect.SliceOf(jsonResources[name]) }
	check := func(name string, typ reflect.Type, args ...string) string {
		t.Helper()
		r := mustOK(t, proc(t, root, args...), strings.Join(args, " "))
		checkJSON(t, strings.Join(args, " ")+" as "+name, typ, json.RawMessage(r.stdout))
		return r.stdout
	}
	check("Volume", jsonResources["Volume"], "volume", "create", "data", "--size", "16M", "--json")
	check("Volume", jsonResources["Volume"], "volume", "create", "spare", "--size", "16M", "--json")
	var sb jsonSandbox
	json.Unmarshal([]byte(check("Sandbox", jsonResources["Sandbox"], "create", "--image", image, "--handle", "doc/one", "--volume", "data:/data", "--json")), &sb)
	check("Sandbox", jsonResources["Sandbox"], "stop", sb.ID, "--json")
	var snap snapshotTaken
	json.Unmarshal([]byte(check("SnapshotTaken", jsonResources["SnapshotTaken"], "snapshot", sb.ID, "--json")), &snap)
	var restored jsonSandbox
	json.Unmarshal([]byte(check("Sandbox", jsonResources["Sandbox"], "restore", snap.Snapshot, "--json")), &restored)
	check("Sandbox", jsonResources["Sandbox"], "stop", restored.ID, "--json")
	check("Sandbox", jsonResources["Sandbox"], "start", restored.ID, "--json")
	check("[]Sandbox", list("Sandbox"), "fork", sb.ID, "--readonly-volumes", "--json")
	check("[]Sandbox", list("Sandbox"), "ls", "--json")
	check("[]Sandbox", list("Sandbox"), "inspect", sb.ID, "--json")
	check("[]Snapshot", list("Snapshot"), "snapshot", "ls", "--json")
	check("[]Volume", list("Volume"), "volume", "ls", "--json")
	check("VolumePruneReport", jsonResources["VolumePruneReport"], "volume", "prune", "--include-detached", "--json")
	check("[]CacheEntry", list("CacheEntry"), "image-cache", "list", "--json")
	check("CachePruneReport", jsonResources["CachePruneReport"], "image-cache", "prune", "--unused", "--dry-run", "--json")
	check("ReapReport", jsonResources["ReapReport"], "reap", "--json")
	check("RecoverReport", jsonResources["RecoverReport"], "recover", "--json")
	check("[]LedgerRun", list("LedgerRun"), "ledger", "ls", "--json")
	check("[]LedgerRun", list("LedgerRun"), "ledger", "sweep", "--dry-run", "--json")
	check("[]Setting", list("Setting"), "config", "show", "--json")
	check("Version", jsonResources["Version"], "version", "--json")
	check("DaemonStatus", jsonResources["DaemonStatus"], "daemon", "status", "--json")
	check("Snapshot", jsonResources["Snapshot"], "snapshot", "rm", snap.Snapshot, "--json")
	check("Removed", jsonResources["Removed"], "rm", "-f", "--with-snapshots", sb.ID, "--json")
	check("[]ReplayEntry", list("ReplayEntry"), "replay", "timeline", sb.ID, "--json")
	check("ReplayState", jsonResources["ReplayState"], "replay", "at", "5", "--json")
	check("VerifyReport", jsonResources["VerifyReport"], "replay", "verify", "--json")
	check("Divergence", jsonResources["Divergence"], "replay", "diff", "--json")
	check("RepairReport", jsonResources["RepairReport"], "journal", "repair", "--backup", filepath.Join(t.TempDir(), "backup"), "--json")

	r := mustOK(t, proc(t, root, "events", "--json"), "events")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) < 10 {
		t.Fatalf("events --json printed %d lines", len(lines))
	}
	for i, line := range lines {
		checkJSON(t, fmt.Sprintf("events line %d", i+1), jsonResources["Event"], json.RawMessage(line))
	}
}

// TestOutputFlags: -q prints IDs only, --format runs a template over the
// JSON's values once per item, tables print human sizes, and the three
// choices exclude each other (usage errors, exit 2).
func TestOutputFlags(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	if r := mustOK(t, proc(t, root, "ls", "-q"), "ls -q"); r.stdout != "" {
		t.Fatalf("ls -q of an empty root printed %q", r.stdout)
	}
	mustOK(t, proc(t, root, "volume", "create", "data", "--size", "16M"), "volume create")
	a := createJSON(t, root, "--image", makeImage(t), "--handle", "out/a")
	b := createJSON(t, root, "--image", makeImage(t))
	ids := []string{a.ID, b.ID}
	sort.Strings(ids)
	if r := mustOK(t, proc(t, root, "ls", "-q"), "ls -q"); r.stdout != strings.Join(ids, "\n")+"\n" {
		t.Fatalf("ls -q printed %q, want %q", r.stdout, ids)
	}
	r := mustOK(t, proc(t, root, "ls", "--format", "{{.ID}} {{.State}} {{.CreatedAt.Location}}"), "ls --format")
	if want := a.ID + " running UTC\n"; !strings.Contains(r.stdout, want) || strings.Count(r.stdout, "\n") != 2 {
		t.Fatalf("ls --format printed %q, want a line %q per sandbox", r.stdout, want)
	}
	if r := mustOK(t, proc(t, root, "inspect", "out/a", "--format", "{{json .Volumes}}"), "inspect --format"); r.stdout != "[]\n" {
		t.Fatalf("inspect --format '{{json .Volumes}}' printed %q", r.stdout)
	}
	if r := mustOK(t, proc(t, root, "volume", "ls"), "volume ls"); !strings.HasPrefix(r.stdout, "NAME") || !strings.Contains(r.stdout, "16 MiB") {
		t.Fatalf("volume ls table %q: want a header and a human size", r.stdout)
	}
	if r := mustOK(t, proc(t, root, "volume", "ls", "-q"), "volume ls -q"); r.stdout != "data\n" {
		t.Fatalf("volume ls -q printed %q", r.stdout)
	}
	if r := mustOK(t, proc(t, root, "events", "--type", "sandbox.created", "--format", "{{.Seq}} {{.Type}} {{.Sandbox}}"), "events --format"); strings.Count(r.stdout, " sandbox.created ") != 2 || !strings.Contains(r.stdout, a.ID) {
		t.Fatalf("events --format printed %q", r.stdout)
	}
	if r := mustOK(t, proc(t, root, "reap", "--format", "{{.Apply}} {{len .Orphans}}"), "reap --format"); r.stdout != "false 0\n" {
		t.Fatalf("reap --format printed %q", r.stdout)
	}
	// The commands that make or change things print through the same layer.
	c := strings.TrimSpace(mustOK(t, proc(t, root, "create", "--image", makeImage(t), "-q"), "create -q").stdout)
	if len(c) != 26 || strings.ContainsAny(c, " \t\n") {
		t.Fatalf("create -q printed %q, want the new sandbox's id alone", c)
	}
	if r := mustOK(t, proc(t, root, "stop", c, b.ID, "--format", "{{.ID}}={{.State}}"), "stop --format"); r.stdout != c+"=stopped\n"+b.ID+"=stopped\n" {
		t.Fatalf("stop --format printed %q", r.stdout)
	}
	if r := mustOK(t, proc(t, root, "fork", c, "--count", "2", "--format", "{{.Parent}}"), "fork --format"); r.stdout != c+"\n"+c+"\n" {
		t.Fatalf("fork --format printed %q: want the template once per child", r.stdout)
	}
	if r := mustOK(t, proc(t, root, "rm", "-f", "-q", c), "rm -q"); r.stdout != c+"\n" {
		t.Fatalf("rm -q printed %q", r.stdout)
	}
	wantFailure(t, proc(t, root, "ls", "--json", "-q"), 2, "exclude each other")
	wantFailure(t, proc(t, root, "ls", "--json", "--format", "{{.ID}}"), 2, "exclude each other")
	wantFailure(t, proc(t, root, "ls", "--format", "{{.ID"), 2, "--format")
	wantFailure(t, proc(t, root, "ls", "--format", "{{.NoSuchField}}"), 2, "NoSuchField")
}
