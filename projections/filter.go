package projections

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nexus-sandbox/nexus/events"
)

// FilterKey names what a --filter tests.
type FilterKey string

const (
	FilterLabel  FilterKey = "label"  // label=KEY (has the label) or label=KEY=VALUE
	FilterState  FilterKey = "state"  // state=running, stopped, ...
	FilterHandle FilterKey = "handle" // handle=H, exactly
	FilterDriver FilterKey = "driver" // driver=D, exactly
	FilterReady  FilterKey = "ready"  // ready=true or ready=false
)

// SandboxFilters are the keys `ls` takes; a volume has labels only, a
// snapshot its sandbox's handle and labels.
var (
	SandboxFilters  = []FilterKey{FilterLabel, FilterState, FilterHandle, FilterDriver, FilterReady}
	VolumeFilters   = []FilterKey{FilterLabel}
	SnapshotFilters = []FilterKey{FilterLabel, FilterHandle}
)

var states = []State{StateCreating, StateStopped, StateRunning, StateExited, StateError}

// Filter is one --filter KEY=VALUE; for a label, Label is the label's key
// and Value its value, or HasValue is false for label=KEY.
type Filter struct {
	Key      FilterKey
	Label    string
	Value    string
	HasValue bool
}

// Filters are every --filter of a command: a thing is listed when it
// matches them all (AND), as docker's filters of different keys combine.
type Filters []Filter

// Facts are what a filter tests of one listed thing.
type Facts struct {
	Labels events.Labels
	State  State
	Handle string
	Driver string
	Ready  bool
}

// SandboxFacts are sb's facts, as ls shows it.
func SandboxFacts(sb Sandbox) Facts {
	ready, _ := sb.Readiness()
	return Facts{Labels: sb.Labels, State: sb.State, Handle: sb.Handle, Driver: sb.Driver, Ready: ready}
}

// VolumeFacts are v's facts: its labels.
func VolumeFacts(v Volume) Facts { return Facts{Labels: v.Labels} }

// ParseFilters reads --filter flags, each KEY=VALUE with KEY one of
// valid. An unknown key, or a value the key cannot have, is refused
// naming what it can be.
func ParseFilters(flags []string, valid []FilterKey) (Filters, error) {
	var out Filters
	for _, s := range flags {
		k, v, ok := strings.Cut(s, "=")
		key := FilterKey(k)
		if !slices.Contains(valid, key) {
			return nil, fmt.Errorf("filter %q: the key is one of %s", s, joinKeys(valid))
		}
		if !ok {
			return nil, fmt.Errorf("filter %q: want %s=VALUE", s, k)
		}
		f := Filter{Key: key, Value: v, HasValue: true}
		switch key {
		case FilterLabel:
			name, value, has := strings.Cut(v, "=")
			f.Label, f.Value, f.HasValue = name, value, has
			if !labelKeyRE().MatchString(name) {
				return nil, fmt.Errorf("filter %q: want label=KEY or label=KEY=VALUE", s)
			}
		case FilterState:
			if !slices.Contains(states, State(v)) {
				return nil, fmt.Errorf("filter %q: the state is one of %s", s, joinKeys(states))
			}
		case FilterReady:
			if v != "true" && v != "false" {
				return nil, fmt.Errorf("filter %q: want ready=true or ready=false", s)
			}
		case FilterHandle, FilterDriver:
			if v == "" {
				return nil, fmt.Errorf("filter %q: want %s=VALUE", s, k)
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// Match says whether x matches every filter.
func (fs Filters) Match(x Facts) bool {
	for _, f := range fs {
		if !f.match(x) {
			return false
		}
	}
	return true
}

func (f Filter) match(x Facts) bool {
	switch f.Key {
	case FilterLabel:
		v, has := x.Labels[f.Label]
		return has && (!f.HasValue || v == f.Value)
	case FilterState:
		return string(x.State) == f.Value
	case FilterHandle:
		return x.Handle == f.Value
	case FilterDriver:
		return x.Driver == f.Value
	case FilterReady:
		return x.Ready == (f.Value == "true")
	}
	return false
}

func joinKeys[S ~string](keys []S) string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = string(k)
	}
	if len(out) == 1 {
		return out[0]
	}
	return strings.Join(out[:len(out)-1], ", ") + " or " + out[len(out)-1]
}
