// Package ledger is the client-process ledger's format and the sweep's
// decision rule, both pure: it parses and renders the files under
// <state-root>/runs/ and decides, from what the edge observed, whether a run
// is kept or swept. host/ledger reads the files and /proc; this package
// never touches either.
package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nexus-sandbox/nexus/layout"
)

// Schema is the record schema this nexus writes and fully understands.
const Schema = 1

// File suffixes of one run's three files.
const (
	RecordSuffix    = ".json"
	SandboxesSuffix = ".sandboxes"
	NetworksSuffix  = ".networks"
)

// ErrMalformed marks a record or list that is not in the format.
var ErrMalformed = errors.New("malformed ledger file")

// ErrSchemaTooNew marks a record written by a newer client. It is kept, never
// swept: its owner may well be alive and we cannot tell.
var ErrSchemaTooNew = errors.New("ledger schema newer than this nexus")

// Record is <run-id>.json.
type Record struct {
	Schema      int    `json:"schema"`
	Run         string `json:"run"`
	Pid         int    `json:"pid"`
	StartTimeMs int64  `json:"start_time_ms"` // the process's own start, Unix ms, from /proc/<pid>/stat
	Driver      string `json:"driver"`
	Nexus       string `json:"nexus"` // absolute path of the nexus binary the run uses, or ""
}

// Marshal renders r as the one-line JSON document a record file holds.
func (r Record) Marshal() ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func (r Record) validate() error {
	switch {
	case r.Schema != Schema:
		return fmt.Errorf("%w: schema %d, want %d", ErrMalformed, r.Schema, Schema)
	case !layout.ValidRunID(r.Run):
		return fmt.Errorf("%w: run id %q", ErrMalformed, r.Run)
	case r.Pid <= 0 || r.Pid > 1<<22:
		return fmt.Errorf("%w: pid %d", ErrMalformed, r.Pid)
	case r.StartTimeMs <= 0:
		return fmt.Errorf("%w: start_time_ms %d", ErrMalformed, r.StartTimeMs)
	case !layout.ValidSandboxRef(r.Driver):
		return fmt.Errorf("%w: driver %q", ErrMalformed, r.Driver)
	case r.Nexus != "" && !strings.HasPrefix(r.Nexus, "/"):
		return fmt.Errorf("%w: nexus path %q is not absolute", ErrMalformed, r.Nexus)
	}
	return nil
}

// ParseRecord reads a record strictly: one JSON object, every field of
// schema 1 present, no unknown field, no trailing data, and a run id equal to
// want (the file's own name). A newer schema is ErrSchemaTooNew, checked
// before anything else so a newer client may add fields.
func ParseRecord(data []byte, want string) (Record, error) {
	// One pass into raw fields (json.Unmarshal also rejects trailing data),
	// then each field exactly: encoding/json would match keys
	// case-insensitively and ignore unknown ones; the format does neither.
	var present map[string]json.RawMessage
	if err := json.Unmarshal(data, &present); err != nil {
		return Record{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	var r Record
	rawSchema, ok := present["schema"]
	if !ok {
		return Record{}, fmt.Errorf("%w: no schema", ErrMalformed)
	}
	if err := json.Unmarshal(rawSchema, &r.Schema); err != nil {
		return Record{}, fmt.Errorf("%w: schema: %v", ErrMalformed, err)
	}
	if r.Schema > Schema {
		return Record{}, fmt.Errorf("%w: %d > %d", ErrSchemaTooNew, r.Schema, Schema)
	}
	fields := []struct {
		name string
		dst  any
	}{{"run", &r.Run}, {"pid", &r.Pid}, {"start_time_ms", &r.StartTimeMs}, {"driver", &r.Driver}, {"nexus", &r.Nexus}}
	if len(present) != len(fields)+1 {
		return Record{}, fmt.Errorf("%w: %d fields, want exactly %d", ErrMalformed, len(present), len(fields)+1)
	}
	for _, f := range fields {
		raw, ok := present[f.name]
		if ok && string(raw) == "null" {
			return Record{}, fmt.Errorf("%w: %s is null", ErrMalformed, f.name)
		}
		if !ok {
			return Record{}, fmt.Errorf("%w: missing %q", ErrMalformed, f.name)
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return Record{}, fmt.Errorf("%w: %s: %v", ErrMalformed, f.name, err)
		}
	}
	if err := r.validate(); err != nil {
		return Record{}, err
	}
	if r.Run != want {
		return Record{}, fmt.Errorf("%w: run %q in the file named %q", ErrMalformed, r.Run, want)
	}
	return r, nil
}

// ParseNames reads a .sandboxes or .networks file: one name per line, each
// ending in "\n". A last line without "\n" is a torn append; it is still
// returned when it is a valid name, because the list must stay a superset of
// what may exist. Duplicates collapse, order is kept. Every valid name is
// returned even when err reports an invalid line, so a dead run can still be
// cleaned of what it names.
func ParseNames(data []byte) ([]string, error) {
	var names []string
	var bad error
	seen := map[string]bool{}
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		s := string(line)
		if !layout.ValidSandboxRef(s) {
			if bad == nil {
				bad = fmt.Errorf("%w: line %q is not a sandbox or network name", ErrMalformed, truncate(s))
			}
			continue
		}
		if !seen[s] {
			seen[s] = true
			names = append(names, s)
		}
	}
	return names, bad
}

// RenderNames is the inverse of ParseNames.
func RenderNames(names []string) []byte {
	var b bytes.Buffer
	for _, n := range names {
		b.WriteString(n)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// Outcome is what a sweep did with one run.
type Outcome struct {
	Run      string   `json:"run"`
	Verdict  string   `json:"verdict"`
	Reason   string   `json:"reason"`
	Removed  []string `json:"removed"`
	NotFound []string `json:"not_found"`
	Networks []string `json:"networks"`
	// WouldRemove is what a sweep of the run would remove (ledger ls and
	// sweep --dry-run only; host/ledger's ListedSandboxes).
	WouldRemove []string `json:"would_remove"`
	Skipped     string   `json:"skipped,omitempty"` // another sweeper has, or had, the run
	Error       string   `json:"error,omitempty"`
}
