package core

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestAdmitCases runs testdata/admit.txt: writers decide on a journal,
// then append, in an interleaving the file spells out, and admission says
// what goes in. The journal is a list of events folded by the real
// projections; what it admits is Admit's answer and nothing else.
//
//	journal                  a new journal holding the input events
//	decide as=<w> cmd=<command> sandbox=<id>
//	decide as=<w> cmd=attach|"volume rm" volume=<name>
//	                         the decision on the journal as it stands; an
//	                         allowed one records what w expects of the entity
//	expect as=<w> on=<entity>,...
//	                         w expects the entities as they stand
//	append [as=<w>]          the input events, expecting what w expects
//	state                    the sandboxes, handles, volumes and open sagas
//
// An input event is `<sandbox>|- <type> [saga=] [kind=] [handle=]
// [old=] [volume=] [parent=] [snapshot=]`. An append that goes in moves w's
// expectations to what it wrote (Advance), as a saga's next step expects.
func TestAdmitCases(t *testing.T) {
	var j *memJournal
	var writers map[string][]Expect
	refused := map[string]bool{}
	runCases(t, "testdata/admit.txt", func(t *testing.T, c testCase) string {
		if c.cmd != "journal" && j == nil {
			t.Fatalf("%s: %s before any journal", c.pos, c.cmd)
		}
		switch c.cmd {
		case "journal":
			c.onlyArgs(t)
			j, writers = newMemJournal(), map[string][]Expect{}
			evs := parseEvents(t, c)
			if n, err := Admit(j, nil, evs); err != nil {
				t.Fatalf("%s: the journal refuses its own events: %d admitted, %v", c.pos, n, err)
			}
			j.append(evs)
			return j.state()
		case "state":
			c.only(t)
			return j.state()
		case "expect":
			c.only(t, "as", "on")
			w := c.args["as"]
			for _, e := range list(c, "on") {
				writers[w] = j.expect(writers[w], Entity(e))
			}
			return expects(w, writers[w])
		case "decide":
			c.only(t, "as", "cmd", "sandbox", "volume")
			w, cmd := c.args["as"], Command(c.args["cmd"])
			var ent Entity
			var err error
			if name, ok := c.arg("volume"); ok {
				ent = Volume(name)
				v := j.volumes.Get(name)
				switch cmd {
				case "attach":
					err = DecideAttach(v, name)
				case "volume rm":
					// As `nexus volume rm` decides: every attachment the
					// journal shows counts.
					err = DecideVolumeRemove(v, name, nil)
				default:
					t.Fatalf("%s: cmd=%s of a volume", c.pos, cmd)
				}
			} else {
				id := c.args["sandbox"]
				ent = Sandbox(id)
				sb := j.sandboxes.Get(id)
				if sb == nil {
					return "no sandbox " + id
				}
				var open []projections.OpenSaga
				for _, sg := range j.sagas.Open() {
					open = append(open, *sg)
				}
				err = Decide(cmd, *sb, open)
			}
			if err != nil {
				return decided(err)
			}
			writers[w] = j.expect(writers[w], ent)
			return "ok; " + expects(w, writers[w])
		case "append":
			c.onlyArgs(t, "as")
			w := c.args["as"]
			evs := parseEvents(t, c)
			n, err := Admit(j, writers[w], evs)
			if (n == len(evs)) != (err == nil) {
				t.Fatalf("%s: Admit = %d of %d, %v", c.pos, n, len(evs), err)
			}
			seqs := j.append(evs[:n])
			if w != "" {
				Advance(writers[w], evs[:n], seqs)
			}
			out := fmt.Sprintf("appended %d of %d", n, len(evs))
			switch {
			case n == 1:
				out += fmt.Sprintf(" (seq %d)", seqs[0])
			case n > 1:
				out += fmt.Sprintf(" (seq %d-%d)", seqs[0], seqs[n-1])
			}
			if err == nil {
				return out
			}
			var held *HandleHeld
			switch {
			case errors.Is(err, ErrStale):
				refused["stale"] = true
				out += "\nstale: "
			case errors.Is(err, ErrSagaClosed):
				refused["saga closed"] = true
				out += "\n" // the error names its class
			case errors.As(err, &held) && errors.Is(err, ErrRefused):
				refused["handle held"] = true
				out += "\nhandle held: "
			case errors.Is(err, ErrRefused):
				refused["refused"] = true
				out += "\n"
			default:
				t.Fatalf("%s: Admit = %v, neither stale, closed nor refused", c.pos, err)
			}
			return out + err.Error()
		}
		t.Fatalf("%s: unknown command %q", c.pos, c.cmd)
		return ""
	})
	// The file shows every way an append is refused.
	for _, r := range []string{"stale", "saga closed", "handle held", "refused"} {
		if !refused[r] {
			t.Errorf("testdata/admit.txt has no append refused as %s", r)
		}
	}
}

// memJournal is a journal as admission reads it: its events, folded by the
// real projections.
type memJournal struct {
	recs      []events.Record
	sandboxes *projections.Sandboxes
	volumes   *projections.Volumes
	sagas     *projections.Sagas
}

func newMemJournal() *memJournal {
	return &memJournal{sandboxes: projections.NewSandboxes(), volumes: projections.NewVolumes(), sagas: projections.NewSagas()}
}

func (j *memJournal) append(evs []events.Event) []uint64 {
	var seqs []uint64
	for _, e := range evs {
		seq := uint64(len(j.recs) + 1)
		j.recs = append(j.recs, events.Record{Seq: seq, Event: e})
		j.sandboxes.Apply(seq, e)
		j.volumes.Apply(seq, e)
		j.sagas.Apply(seq, e)
		seqs = append(seqs, seq)
	}
	return seqs
}

// Rev is the sequence of the last event about e: the last event naming it
// (EntitiesOf), for a handle the last handle.claimed, as the journal's
// subjects hold them.
func (j *memJournal) Rev(e Entity) (uint64, error) {
	for i := len(j.recs) - 1; i >= 0; i-- {
		r := j.recs[i]
		if e.Kind() == "handle" {
			if c, ok := r.Event.Payload.(events.HandleClaimedEvent); ok && Handle(c.Handle) == e {
				return r.Seq, nil
			}
			continue
		}
		if slices.Contains(EntitiesOf(r.Event), e) {
			return r.Seq, nil
		}
	}
	return 0, nil
}

func (j *memJournal) SagaOpen(id string) bool { return j.sagas.Get(id) != nil }

func (j *memJournal) Holder(h string) (string, error) {
	if sb := j.sandboxes.ByHandle(h); sb != nil {
		return sb.ID, nil
	}
	return "", nil
}

// expect sets x's expectation of e to e's revision now.
func (j *memJournal) expect(x []Expect, e Entity) []Expect {
	rev, _ := j.Rev(e)
	for i := range x {
		if x[i].Entity == e {
			x[i].Seq = rev
			return x
		}
	}
	return append(x, Expect{Entity: e, Seq: rev})
}

func expects(w string, x []Expect) string {
	var parts []string
	for _, e := range x {
		parts = append(parts, fmt.Sprintf("%s@%d", e.Entity, e.Seq))
	}
	return fmt.Sprintf("%s expects %s", w, strings.Join(parts, " "))
}

func (j *memJournal) state() string {
	var out []string
	for _, sb := range j.sandboxes.List() {
		l := fmt.Sprintf("sandbox %s %s rev=%d", sb.ID, sb.State, sb.Rev)
		if sb.Handle != "" {
			l += " handle=" + sb.Handle
		}
		for _, v := range sb.Volumes {
			l += " volume=" + v.Name
		}
		out = append(out, l)
	}
	for _, v := range j.volumes.List() {
		l := fmt.Sprintf("volume %s rev=%d", v.Name, v.Rev)
		if len(v.AttachedTo) > 0 {
			l += " attached=" + strings.Join(v.AttachedTo, ",")
		}
		out = append(out, l)
	}
	for _, sg := range j.sagas.Open() {
		on := sg.Sandbox
		if on == "" {
			on = "-"
		}
		out = append(out, fmt.Sprintf("saga %s %s on %s open", sg.ID, sg.Kind, on))
	}
	if len(out) == 0 {
		return "empty"
	}
	return strings.Join(out, "\n")
}

// parseEvents reads a case's input lines as events.
func parseEvents(t *testing.T, c testCase) []events.Event {
	t.Helper()
	var evs []events.Event
	for _, l := range c.input {
		fields, err := splitArgs(l)
		if err != nil || len(fields) < 2 {
			t.Fatalf("%s: event %q: want `<sandbox>|- <type> key=value...` (%v)", c.pos, l, err)
		}
		sb := fields[0]
		if sb == "-" {
			sb = ""
		}
		a := map[string]string{}
		for _, f := range fields[2:] {
			k, v, _ := strings.Cut(f, "=")
			if !slices.Contains([]string{"saga", "kind", "handle", "old", "volume", "parent", "snapshot"}, k) {
				t.Fatalf("%s: event %q: unknown key %q", c.pos, l, k)
			}
			a[k] = v
		}
		var p events.Payload
		switch events.Type(fields[1]) {
		case events.SagaStarted:
			p = events.SagaStartedEvent{Kind: events.SagaKind(a["kind"])}
		case events.SagaFinished:
			p = events.SagaFinishedEvent{}
		case events.SagaCompensated:
			p = events.SagaCompensatedEvent{}
		case events.SandboxCreated:
			p = events.SandboxCreatedEvent{Handle: a["handle"]}
		case events.SandboxForked:
			p = events.SandboxForkedEvent{Parent: a["parent"], Handle: a["handle"]}
		case events.SandboxRestored:
			p = events.SandboxRestoredEvent{Snapshot: a["snapshot"], Handle: a["handle"]}
		case events.SandboxStarted:
			p = events.SandboxStartedEvent{VMMPid: 1}
		case events.SandboxStopped:
			p = events.SandboxStoppedEvent{}
		case events.SandboxRemoved:
			p = events.SandboxRemovedEvent{}
		case events.SandboxRenamed:
			p = events.SandboxRenamedEvent{Old: a["old"], Handle: a["handle"]}
		case events.HandleClaimed:
			p = events.HandleClaimedEvent{Sandbox: sb, Handle: a["handle"]}
		case events.SnapshotTaken:
			p = events.SnapshotTakenEvent{SnapshotID: a["snapshot"]}
		case events.VolumeCreated:
			p = events.VolumeCreatedEvent{Name: a["volume"]}
		case events.VolumeAttached:
			p = events.VolumeAttachedEvent{Name: a["volume"]}
		case events.VolumeDetached:
			p = events.VolumeDetachedEvent{Name: a["volume"]}
		case events.VolumeRemoved:
			p = events.VolumeRemovedEvent{Name: a["volume"]}
		default:
			t.Fatalf("%s: event type %q is not one the cases use", c.pos, fields[1])
		}
		e := events.New(ulid.Make(), time.Unix(1, 0), sb, p)
		e.Saga = a["saga"]
		evs = append(evs, e)
	}
	return evs
}
