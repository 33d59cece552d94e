package replay

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

// memFleet is an aggregate in memory: records with their subjects, read
// with NATS subject matching, as the server filters.
type memFleet struct {
	subjects []string
	recs     []FleetRecord
	reads    [][]string // the filters of each read
}

func (m *memFleet) add(t *testing.T, host string, sandbox string, p events.Payload) {
	t.Helper()
	e := events.New(ulid.Make(), time.Unix(int64(len(m.recs)), 0), sandbox, p)
	data, err := events.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	subj, err := e.Subject()
	if err != nil {
		t.Fatal(err)
	}
	var seq uint64 = 1
	for _, r := range m.recs {
		if r.Host == host {
			seq++
		}
	}
	m.subjects = append(m.subjects, host+"."+subj)
	m.recs = append(m.recs, FleetRecord{Host: host, Seq: seq, FleetSeq: uint64(len(m.recs) + 1), Data: data})
}

func matches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || tok != "*" && tok != s[i] {
			return false
		}
	}
	return len(f) == len(s)
}

func (m *memFleet) read(filters []string, fn func(FleetRecord) error) error {
	m.reads = append(m.reads, filters)
	for i, r := range m.recs {
		ok := len(filters) == 0
		for _, f := range filters {
			ok = ok || matches(f, m.subjects[i])
		}
		if ok {
			if err := fn(r); err != nil {
				return err
			}
		}
	}
	return nil
}

func TestFleetFilters(t *testing.T) {
	id := ulid.Make().String()
	for _, c := range []struct {
		hosts   []string
		sandbox string
		types   []string
		want    []string
	}{
		{nil, "", nil, nil},
		{[]string{"b", "a", "a"}, "", nil, []string{"a.nexus.events.>", "b.nexus.events.>"}},
		{nil, id, []string{"sandbox"}, []string{"*.nexus.events.sandbox.*." + id}},
		{[]string{"a"}, "", []string{"mirror.linked", "vmm"}, []string{"a.nexus.events.mirror.linked.*", "a.nexus.events.vmm.*.*"}},
	} {
		got, err := FleetFilters(c.hosts, c.sandbox, c.types)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("FleetFilters(%v, %q, %v) = %v, %v; want %v", c.hosts, c.sandbox, c.types, got, err, c.want)
		}
	}
	if _, err := FleetFilters(nil, "", []string{"nosuch"}); err == nil {
		t.Error("an unknown type was accepted")
	}
}

// A handle is a host's: find gives one row per host, each host's newest
// sandbox with that handle, its state there and its last event; timeline
// reads only those sandboxes' subjects.
func TestFleetFindAndTimeline(t *testing.T) {
	old, reused, onB := ulid.Make().String(), ulid.Make().String(), ulid.Make().String()
	m := &memFleet{}
	m.add(t, "host-a", old, events.SandboxCreatedEvent{Handle: "web", Image: "i", Driver: "process"})
	m.add(t, "host-b", onB, events.SandboxCreatedEvent{Handle: "web", Image: "i", Driver: "process"})
	m.add(t, "host-a", old, events.SandboxRemovedEvent{})
	m.add(t, "host-a", reused, events.SandboxCreatedEvent{Handle: "web", Image: "i", Driver: "process"})
	m.add(t, "host-b", "", events.VolumeCreatedEvent{Name: "v"})
	m.add(t, "host-b", onB, events.SandboxStartedEvent{Driver: "process", VMMPid: 7})

	found, err := FleetFind(m.read, "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 2 ||
		found[0].Host != "host-a" || found[0].ID != reused || found[0].Handle != "web" || found[0].State != "stopped" || found[0].Last.Seq != 3 ||
		found[1].Host != "host-b" || found[1].ID != onB || found[1].State != "running" || found[1].Last.Type != events.SandboxStarted || found[1].Last.Seq != 3 {
		t.Fatalf("find web: %+v", found)
	}
	found, err = FleetFind(m.read, old)
	if err != nil || len(found) != 1 || found[0].State != "removed" || found[0].Host != "host-a" {
		t.Fatalf("find %s: %+v %v", old, found, err)
	}
	if _, err := FleetFind(m.read, "nosuch"); err == nil {
		t.Fatal("found a handle no host has")
	}

	m.reads = nil
	tl, err := FleetTimeline(m.read, onB)
	if err != nil || len(tl) != 2 || tl[0].Host != "host-b" || tl[0].FleetSeq != 2 || tl[1].Type != events.SandboxStarted {
		t.Fatalf("timeline %s: %+v %v", onB, tl, err)
	}
	if !reflect.DeepEqual(m.reads, [][]string{{"*.nexus.events.*.*." + onB}}) {
		t.Fatalf("the timeline of an ID read %v, not its subjects once", m.reads)
	}
	m.reads = nil
	if tl, err := FleetTimeline(m.read, "web"); err != nil || len(tl) != 3 {
		t.Fatalf("timeline web: %+v %v", tl, err)
	}
	if last := m.reads[len(m.reads)-1]; !reflect.DeepEqual(last, []string{"host-a.nexus.events.*.*." + reused, "host-b.nexus.events.*.*." + onB}) {
		t.Fatalf("the timeline of a handle read %v, not each host's sandbox's subjects", last)
	}
	if _, err := FleetTimeline(m.read, ulid.Make().String()); err == nil {
		t.Fatal("a timeline of an ID no host has")
	}
}
