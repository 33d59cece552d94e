package projections

import (
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/events"
)

func TestFilters(t *testing.T) {
	web := Sandbox{ID: "A", Handle: "web/1", Driver: "process", State: StateRunning, Labels: events.Labels{"team": "web", "tier": ""},
		VMM: &Process{Pid: 1}, LastRun: "r", ReadyAt: time.Unix(1, 0)}
	db := Sandbox{ID: "B", Handle: "db", Driver: "qemu", State: StateStopped, Labels: events.Labels{"team": "db"}}
	bare := Sandbox{ID: "C", State: StateStopped}
	for _, c := range []struct {
		flags []string
		want  string // the IDs listed
	}{
		{nil, "ABC"},
		{[]string{"label=team"}, "AB"},
		{[]string{"label=team=web"}, "A"},
		{[]string{"label=tier="}, "A"},
		{[]string{"label=tier=x"}, ""},
		{[]string{"state=stopped"}, "BC"},
		{[]string{"state=stopped", "label=team"}, "B"}, // AND
		{[]string{"label=team=web", "label=team=db"}, ""},
		{[]string{"handle=web/1"}, "A"},
		{[]string{"handle=web"}, ""},
		{[]string{"driver=qemu"}, "B"},
		{[]string{"ready=true"}, "A"},
		{[]string{"ready=false"}, "BC"},
	} {
		fs, err := ParseFilters(c.flags, SandboxFilters)
		if err != nil {
			t.Fatalf("%q: %v", c.flags, err)
		}
		got := ""
		for _, sb := range []Sandbox{web, db, bare} {
			if fs.Match(SandboxFacts(sb)) {
				got += sb.ID
			}
		}
		if got != c.want {
			t.Errorf("%q lists %q, want %q", c.flags, got, c.want)
		}
	}
	for _, c := range []struct {
		flags []string
		valid []FilterKey
		err   string
	}{
		{[]string{"name=x"}, SandboxFilters, `filter "name=x": the key is one of label, state, handle, driver or ready`},
		{[]string{"state=x"}, VolumeFilters, `the key is one of label`},
		{[]string{"state"}, SandboxFilters, `want state=VALUE`},
		{[]string{"state=up"}, SandboxFilters, `the state is one of creating, stopped, running, exited or error`},
		{[]string{"ready=yes"}, SandboxFilters, `want ready=true or ready=false`},
		{[]string{"label="}, SandboxFilters, `want label=KEY or label=KEY=VALUE`},
		{[]string{"handle="}, SnapshotFilters, `want handle=VALUE`},
	} {
		_, err := ParseFilters(c.flags, c.valid)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%q: %v, want %q", c.flags, err, c.err)
		}
	}
}
