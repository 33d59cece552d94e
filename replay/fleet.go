package replay

import (
	"fmt"
	"slices"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// FleetRecord is one record of the fleet's aggregate: an event of one host.
type FleetRecord struct {
	Host     string
	Seq      uint64 // in the host's journal
	FleetSeq uint64 // in the aggregate
	Data     []byte
}

// FleetReader reads the aggregate's records matching any of filters (all
// when nil), in the aggregate's order, until fn returns an error. The
// reading itself is the caller's (host/journal); what is read is decided
// here.
type FleetReader func(filters []string, fn func(FleetRecord) error) error

// FleetEntry is one event of the fleet, carrying its host.
type FleetEntry struct {
	Host     string `json:"host"`
	FleetSeq uint64 `json:"fleet_seq"`
	Entry
	ev events.Event
}

// Unreadable is the error of r, whose event did not decode with err.
func (r FleetRecord) Unreadable(err error) error {
	return fmt.Errorf("%w: host %s seq %d: %v", ErrUnreadable, r.Host, r.Seq, err)
}

// DecodeFleet decodes one aggregate record.
func DecodeFleet(r FleetRecord) (FleetEntry, error) {
	e, err := events.Decode(r.Data)
	if err != nil {
		return FleetEntry{}, r.Unreadable(err)
	}
	return FleetEntry{Host: r.Host, FleetSeq: r.FleetSeq, Entry: Entry{Seq: r.Seq, Time: e.Time, Type: e.Type,
		Sandbox: e.Sandbox, Saga: e.Saga, Step: e.Step, ID: e.ID.String(), Payload: e.Payload}, ev: e}, nil
}

// FleetFilters are the aggregate's subject filters for events of any of
// hosts (none: every host), of a sandbox ULID ("" for all) and of any of
// types (full types or categories, as `nexus events --type`); nil selects
// everything.
func FleetFilters(hosts []string, sandbox string, types []string) ([]string, error) {
	base, err := events.FilterSubjects(types, sandbox)
	if err != nil {
		return nil, err
	}
	if len(hosts) == 0 && base == nil {
		return nil, nil
	}
	if base == nil {
		base = []string{events.SubjectPrefix + ".>"}
	}
	if len(hosts) == 0 {
		hosts = []string{"*"}
	}
	var out []string
	for _, h := range slices.Compact(slices.Sorted(slices.Values(hosts))) {
		for _, b := range base {
			out = append(out, h+"."+b)
		}
	}
	return out, nil
}

// Located is a sandbox on a host.
type Located struct {
	Host string `json:"host"`
	ID   string `json:"id"`
}

// FleetLocate finds ref on every host: a sandbox ULID wherever an event
// names it, or a handle on each host whose newest sandbox committed with
// it carries it (a handle is a host's, so two hosts may each have one).
func FleetLocate(read FleetReader, ref string) ([]Located, error) {
	if _, err := ulid.ParseStrict(ref); err == nil {
		var out []Located
		err := read([]string{"*." + events.SandboxSubjects(ref)}, func(r FleetRecord) error {
			if !slices.Contains(out, Located{r.Host, ref}) {
				out = append(out, Located{r.Host, ref})
			}
			return nil
		})
		return out, err
	}
	var filters []string
	for _, t := range []events.Type{events.SandboxCreated, events.SandboxForked, events.SandboxRestored, events.SandboxRenamed} {
		f, err := events.FilterSubject(string(t), "")
		if err != nil {
			return nil, err
		}
		filters = append(filters, "*."+f)
	}
	newest := map[string]string{} // host -> sandbox
	var hosts []string
	err := read(filters, func(r FleetRecord) error {
		e, err := DecodeFleet(r)
		if err != nil {
			return err
		}
		if handleOf(e.Payload) == ref {
			if _, ok := newest[r.Host]; !ok {
				hosts = append(hosts, r.Host)
			}
			newest[r.Host] = e.Sandbox
		}
		return nil
	})
	var out []Located
	for _, h := range hosts {
		out = append(out, Located{h, newest[h]})
	}
	return out, err
}

// FleetTimeline is every event of ref (FleetLocate) on every host that has
// it, in the aggregate's order, each with its host.
func FleetTimeline(read FleetReader, ref string) ([]FleetEntry, error) {
	// An ID is read once, on whichever hosts have it; a handle is first
	// located on each host.
	filters := []string{"*." + events.SandboxSubjects(ref)}
	if _, err := ulid.ParseStrict(ref); err != nil {
		found, err := FleetLocate(read, ref)
		if err != nil {
			return nil, err
		}
		filters = filters[:0]
		for _, l := range found {
			filters = append(filters, l.Host+"."+events.SandboxSubjects(l.ID))
		}
	}
	out := []FleetEntry{}
	if len(filters) > 0 {
		err := read(filters, func(r FleetRecord) error {
			e, err := DecodeFleet(r)
			if err == nil {
				out = append(out, e)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no host's events name sandbox %q", ref)
	}
	return out, nil
}

// Found is where a sandbox is in the fleet: its host, its state as that
// host's journal left it ("removed" once removed, "gone" when nothing of
// it was committed, such as a create undone), and its last event.
type Found struct {
	Host   string     `json:"host"`
	ID     string     `json:"id"`
	Handle string     `json:"handle,omitempty"`
	State  string     `json:"state"`
	Last   FleetEntry `json:"last_event"`
}

// FleetFind answers "where is ref": one row per host that has it.
func FleetFind(read FleetReader, ref string) ([]Found, error) {
	entries, err := FleetTimeline(read, ref)
	if err != nil {
		return nil, err
	}
	type fold struct {
		sbs     *projections.Sandboxes
		handle  string
		last    FleetEntry
		removed bool
	}
	per := map[Located]*fold{}
	var order []Located
	for _, e := range entries {
		k := Located{e.Host, e.Sandbox}
		f := per[k]
		if f == nil {
			f = &fold{sbs: projections.NewSandboxes()}
			per[k] = f
			order = append(order, k)
		}
		f.sbs.Apply(e.Seq, e.ev)
		if h := handleOf(e.Payload); h != "" {
			f.handle = h
		}
		f.removed = f.removed || e.Type == events.SandboxRemoved
		f.last = e
	}
	out := make([]Found, 0, len(order))
	for _, k := range order {
		f := per[k]
		state := "gone"
		switch sb := f.sbs.Get(k.ID); {
		case f.removed:
			state = "removed"
		case sb != nil:
			state = string(sb.State)
		}
		out = append(out, Found{Host: k.Host, ID: k.ID, Handle: f.handle, State: state, Last: f.last})
	}
	slices.SortFunc(out, func(a, b Found) int { return strings.Compare(a.Host, b.Host) })
	return out, nil
}
