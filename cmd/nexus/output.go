package main

// The output layer: every command that prints data prints it through
// here, so that --json, --format and -q mean the same thing everywhere
// and every JSON document keeps the rules of docs/json.md (snake_case,
// [] never null, RFC 3339 UTC times, sizes as *_bytes integers).

import (
	"bufio"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// output is a command's choice of printing: at most one of the three.
type output struct {
	json    bool
	format  string
	quiet   bool
	noTrunc bool               // tables print whole IDs (addNoTrunc)
	tmpl    *template.Template // format, parsed once by check
}

// addOutput gives c --json and --format, and -q/--quiet when the command
// prints things that have IDs.
func addOutput(c *cobra.Command, quiet bool) *output {
	o := &output{}
	c.Flags().BoolVar(&o.json, "json", false, "print JSON (see docs/json.md)")
	c.Flags().StringVar(&o.format, "format", "", "table (the default), json (as --json), or a Go template over the JSON values' Go fields, e.g. '{{.ID}}' ('{{json .}}' for one JSON line)")
	if quiet {
		c.Flags().BoolVarP(&o.quiet, "quiet", "q", false, "print only IDs (names for volumes, paths for reap), one a line")
	}
	next := c.PreRunE
	c.PreRunE = func(cmd *cobra.Command, args []string) error {
		if err := o.check(); err != nil {
			return usageError{err}
		}
		if next != nil {
			return next(cmd, args)
		}
		return nil
	}
	return o
}

// addNoTrunc gives a command whose table shows sandbox or snapshot IDs
// --no-trunc: its table then prints them whole, not short.
func addNoTrunc(c *cobra.Command, o *output) {
	c.Flags().BoolVar(&o.noTrunc, "no-trunc", false, "print whole IDs in the table, not their short form (--json, --format and -q always do)")
}

// id is a sandbox or snapshot ID as a table shows it: its short form
// (projections.ShortID; every command accepts it), or whole with
// --no-trunc. JSON, templates and -q print IDs whole.
func (o *output) id(id string) string {
	if id == "" || o != nil && o.noTrunc {
		return id
	}
	return projections.ShortID(id)
}

func (o *output) check() error {
	// docker's two named formats: the default table, and --json.
	switch o.format {
	case "table":
		o.format = ""
	case "json":
		o.format, o.json = "", true
	}
	n := 0
	for _, set := range []bool{o.json, o.format != "", o.quiet} {
		if set {
			n++
		}
	}
	if n > 1 {
		return errors.New("--json, --format and -q exclude each other")
	}
	if o.format != "" {
		t, err := o.template()
		if err != nil {
			return fmt.Errorf("--format: %w", err)
		}
		o.tmpl = t
	}
	return nil
}

// human says the command prints its own text (a table or a report).
func (o *output) human() bool { return o == nil || !o.json && o.format == "" && !o.quiet }

func (o *output) template() (*template.Template, error) {
	return template.New("format").Funcs(template.FuncMap{
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		"join":   strings.Join,
		"labels": labelsText,
		"size":   func(n int64) string { return formatSize(n) },
		"upper":  strings.ToUpper,
	}).Parse(o.format)
}

// printList prints items: a JSON array (never null), the template once per
// item, the IDs, or the table.
func printList[T any](cmd *cobra.Command, o *output, items []T, id func(T) string, t table[T]) error {
	w := cmd.OutOrStdout()
	switch {
	case o.json:
		if items == nil {
			items = []T{}
		}
		return printJSON(w, items)
	case o.format != "":
		for _, it := range items {
			if err := o.execute(w, it); err != nil {
				return err
			}
		}
		return nil
	case o.quiet:
		for _, it := range items {
			fmt.Fprintln(w, id(it))
		}
		return nil
	}
	return t.print(w, items)
}

// printValue prints one value (a report): JSON, the template once, the
// IDs it names, or the command's human text.
func printValue(cmd *cobra.Command, o *output, v any, ids func() []string, human func(io.Writer)) error {
	w := cmd.OutOrStdout()
	switch {
	case o.json:
		return printJSON(w, v)
	case o.format != "":
		// A list (fork's children) runs the template per item, as printList does.
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice {
			for i := range rv.Len() {
				if err := o.execute(w, rv.Index(i).Interface()); err != nil {
					return err
				}
			}
			return nil
		}
		return o.execute(w, v)
	case o.quiet && ids != nil:
		for _, id := range ids() {
			fmt.Fprintln(w, id)
		}
		return nil
	}
	human(w)
	return nil
}

// printStreamed prints one item of a stream as it arrives (events, a
// follow): one compact JSON object a line, so a follower can decode each
// as it comes; the template; its ID; or the command's line for people.
func printStreamed(w io.Writer, o *output, v any, id string, line func() string) error {
	var err error
	switch {
	case o.json:
		err = json.NewEncoder(w).Encode(normalize(reflect.ValueOf(v)).Interface())
	case o.format != "":
		err = o.execute(w, v)
	case o.quiet:
		_, err = fmt.Fprintln(w, id)
	default:
		_, err = fmt.Fprintln(w, line())
	}
	return err
}

func (o *output) execute(w io.Writer, v any) error {
	t := o.tmpl
	if t == nil {
		var err error
		if t, err = o.template(); err != nil {
			return usageError{fmt.Errorf("--format: %w", err)}
		}
	}
	var b strings.Builder
	if err := t.Execute(&b, normalize(reflect.ValueOf(v)).Interface()); err != nil {
		return usageError{fmt.Errorf("--format: %w", err)}
	}
	s := b.String()
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	_, err := io.WriteString(w, s)
	return err
}

// table is how a list prints for people: a header and one row per item,
// aligned by text/tabwriter (what docker and kubectl print: no borders,
// so a table library would add a dependency for nothing).
type table[T any] struct {
	header []string
	row    func(T) []string
	// labels, when set, are an item's labels: the table gains a LABELS
	// column when any item it prints has one, so a listing of unlabelled
	// things keeps its width.
	labels func(T) events.Labels
}

func (t table[T]) print(w io.Writer, items []T) error {
	// tabwriter writes each cell on its own: one write(2) per cell
	// without the buffer.
	bw := bufio.NewWriter(w)
	tw := tabwriter.NewWriter(bw, 0, 4, 2, ' ', 0)
	withLabels := t.labels != nil && slices.ContainsFunc(items, func(it T) bool { return len(t.labels(it)) > 0 })
	header := t.header
	if withLabels {
		header = append(slices.Clip(header), "LABELS")
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, it := range items {
		cells := t.row(it)
		if withLabels {
			cells = append(cells, labelsText(t.labels(it)))
		}
		for i, c := range cells {
			cells[i] = dash(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return bw.Flush()
}

// labelsText prints labels as docker's tables do: k=v pairs, sorted by
// key, joined by commas ("" for none).
func labelsText(l events.Labels) string {
	pairs := make([]string, 0, len(l))
	for _, k := range slices.Sorted(maps.Keys(l)) {
		pairs = append(pairs, k+"="+l[k])
	}
	return strings.Join(pairs, ",")
}

// age prints how long ago t was for a table ("3 minutes ago"), "-" for
// an unknown time.
func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return humanize.Time(t)
}

// printJSON writes v as one indented JSON document. A struct whose
// fields jsonFieldsOf can name is written a field at a time, and each of
// its lists an item at a time: encoding/json holds a whole document in
// memory, twice (compact, then indented), and a reap's report at scale
// lists hundreds of thousands of entries. The bytes are the same.
func printJSON(w io.Writer, v any) error {
	nv := normalize(reflect.ValueOf(v))
	for nv.Kind() == reflect.Pointer && !nv.IsNil() {
		nv = nv.Elem()
	}
	if fields, ok := jsonFieldsOf(nv); ok {
		bw := bufio.NewWriter(w)
		if err := writeJSONStruct(bw, nv, fields); err != nil {
			return err
		}
		return bw.Flush()
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(nv.Interface())
}

// encodedField is a field of a struct as encoding/json names it.
type encodedField struct {
	index     int
	key       []byte // the name, encoded
	omitEmpty bool
}

// jsonFieldsOf is how encoding/json encodes v's fields, if v is a struct
// it encodes field by field with nothing but names and omitempty: no
// embedded field, no other option, no name it would not take as given.
func jsonFieldsOf(v reflect.Value) ([]encodedField, bool) {
	if !v.IsValid() || v.Kind() != reflect.Struct || encodesItself(v.Type()) {
		return nil, false
	}
	t := v.Type()
	var out []encodedField
	seen := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			return nil, false
		}
		tag := f.Tag.Get("json")
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, opt, _ := strings.Cut(tag, ",")
		if opt != "" && opt != "omitempty" {
			return nil, false
		}
		if name == "" {
			name = f.Name
		}
		if seen[name] || strings.ContainsFunc(name, func(r rune) bool {
			return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
		}) {
			return nil, false
		}
		seen[name] = true
		key, _ := json.Marshal(name)
		out = append(out, encodedField{index: i, key: key, omitEmpty: opt == "omitempty"})
	}
	return out, true
}

// writeJSONStruct writes struct v as json.Encoder indented by two spaces
// would, each list an item at a time.
func writeJSONStruct(w *bufio.Writer, v reflect.Value, fields []encodedField) error {
	sep := "{\n  "
	for _, f := range fields {
		fv := v.Field(f.index)
		if f.omitEmpty && emptyJSON(fv) {
			continue
		}
		w.WriteString(sep)
		sep = ",\n  "
		w.Write(f.key)
		w.WriteString(": ")
		if fv.Kind() != reflect.Slice || fv.Len() == 0 || fv.Type().Elem().Kind() == reflect.Uint8 || encodesItself(fv.Type()) {
			if err := writeIndented(w, fv, "  "); err != nil {
				return err
			}
			continue
		}
		for i := range fv.Len() {
			if i == 0 {
				w.WriteString("[\n    ")
			} else {
				w.WriteString(",\n    ")
			}
			if err := writeIndented(w, fv.Index(i), "    "); err != nil {
				return err
			}
		}
		w.WriteString("\n  ]")
	}
	if sep == "{\n  " {
		w.WriteString("{")
	} else {
		w.WriteString("\n")
	}
	_, err := w.WriteString("}\n")
	return err
}

// writeIndented writes v's JSON indented by two spaces, its lines after
// the first behind prefix.
func writeIndented(w *bufio.Writer, v reflect.Value, prefix string) error {
	b, err := json.MarshalIndent(v.Interface(), prefix, "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// emptyJSON is encoding/json's "empty" for omitempty.
func emptyJSON(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool:
		return !v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() == 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint() == 0
	case reflect.Float32, reflect.Float64:
		return v.Float() == 0
	case reflect.Interface, reflect.Pointer:
		return v.IsNil()
	}
	return false
}

var (
	timeType      = reflect.TypeFor[time.Time]()
	marshalerType = reflect.TypeFor[json.Marshaler]()
	textType      = reflect.TypeFor[encoding.TextMarshaler]()
)

// normalize returns a copy of v in which every nil slice is empty and
// every time is UTC, so no JSON document and no template ever sees a null
// list or a local time, whichever type a command prints. Unexported
// fields are not copied: JSON never sees them either. A value that
// encodes itself (json.Marshaler, encoding.TextMarshaler) is kept as is,
// and so is one whose type holds neither a list nor a time (settled):
// a long list of such values is not copied.
func normalize(v reflect.Value) reflect.Value {
	if !v.IsValid() {
		return v
	}
	t := v.Type()
	if t == timeType {
		return reflect.ValueOf(v.Interface().(time.Time).UTC())
	}
	if encodesItself(t) || settled(t) {
		return v
	}
	switch t.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return v
		}
		n := reflect.New(t.Elem())
		n.Elem().Set(normalize(v.Elem()))
		return n
	case reflect.Interface:
		if v.IsNil() {
			return v
		}
		n := reflect.New(t).Elem()
		n.Set(normalize(v.Elem()))
		return n
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return v // []byte encodes as base64, never as a list
		}
		if !v.IsNil() && settled(t.Elem()) {
			return v
		}
		n := reflect.MakeSlice(t, v.Len(), v.Len())
		for i := range v.Len() {
			n.Index(i).Set(normalize(v.Index(i)))
		}
		return n
	case reflect.Map:
		if v.IsNil() {
			return reflect.MakeMap(t)
		}
		n := reflect.MakeMapWithSize(t, v.Len())
		for it := v.MapRange(); it.Next(); {
			n.SetMapIndex(it.Key(), normalize(it.Value()))
		}
		return n
	case reflect.Struct:
		n := reflect.New(t).Elem()
		for i := range t.NumField() {
			if t.Field(i).IsExported() {
				n.Field(i).Set(normalize(v.Field(i)))
			}
		}
		return n
	}
	return v
}

// encodesItself reports whether normalize keeps t's values as they are
// because they encode themselves.
func encodesItself(t reflect.Type) bool {
	return t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface &&
		(t.Implements(marshalerType) || t.Implements(textType) || reflect.PointerTo(t).Implements(marshalerType))
}

// settledTypes caches settled's answers by type.
var settledTypes sync.Map

// settled reports whether normalize leaves every value of type t as it
// is: t reaches, through its exported fields and array elements, no
// slice other than bytes, no map, pointer, interface or time, unless in
// a value that encodes itself.
func settled(t reflect.Type) bool {
	if ok, known := settledTypes.Load(t); known {
		return ok.(bool)
	}
	ok := t != timeType
	if ok && !encodesItself(t) {
		switch t.Kind() {
		case reflect.Slice:
			ok = t.Elem().Kind() == reflect.Uint8
		case reflect.Map, reflect.Pointer, reflect.Interface:
			ok = false
		case reflect.Array:
			ok = settled(t.Elem())
		case reflect.Struct:
			for i := range t.NumField() {
				if f := t.Field(i); f.IsExported() && !settled(f.Type) {
					ok = false
					break
				}
			}
		}
	}
	settledTypes.Store(t, ok)
	return ok
}

// confirmDelete asks before user data (volumes) is deleted, naming every
// one. Without a terminal to ask on, it refuses unless --yes: a script
// must say so, never delete by default.
func confirmDelete(cmd *cobra.Command, yes bool, what string, names []string) error {
	if yes || len(names) == 0 {
		return nil
	}
	in, ok := cmd.InOrStdin().(*os.File)
	if !ok || !term.IsTerminal(int(in.Fd())) {
		return usageError{fmt.Errorf("%s would delete volume(s) %s and their files: pass --yes to confirm (stdin is not a terminal to ask on)", what, strings.Join(names, ", "))}
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "%s deletes these volumes and every file in them:\n", what)
	for _, n := range names {
		fmt.Fprintf(cmd.ErrOrStderr(), "  %s\n", n)
	}
	fmt.Fprint(cmd.ErrOrStderr(), "Delete them? [y/N] ")
	line, _ := bufio.NewReader(in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return errors.New("not confirmed: nothing deleted")
}
