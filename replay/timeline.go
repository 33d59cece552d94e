package replay

import (
	"errors"
	"fmt"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// ErrUnreadable means a record of the journal does not decode; timeline and
// at refuse rather than describe a history with a hole in it (verify lists
// every such record).
var ErrUnreadable = errors.New("journal record does not decode")

// Entry is one event of a timeline.
type Entry struct {
	Seq     uint64         `json:"seq"`
	Time    time.Time      `json:"time"`
	Type    events.Type    `json:"type"`
	Sandbox string         `json:"sandbox,omitempty"`
	Saga    string         `json:"saga,omitempty"`
	Step    string         `json:"step,omitempty"`
	ID      string         `json:"id"`
	Payload events.Payload `json:"data"`
}

// decoded is a record whose event decoded.
type decoded struct {
	seq uint64
	ev  events.Event
}

func decodeAll(records []Record) ([]decoded, error) {
	out := make([]decoded, 0, len(records))
	for _, r := range records {
		e, err := events.Decode(r.Data)
		if err != nil {
			return nil, fmt.Errorf("%w: seq %d: %v", ErrUnreadable, r.Seq, err)
		}
		out = append(out, decoded{r.Seq, e})
	}
	return out, nil
}

// Resolve turns ref, a sandbox ULID or handle, into the ULID the journal
// knows it by. A handle names the newest sandbox committed with it, removed
// or not, since an audit is usually about a sandbox that is gone.
func Resolve(records []Record, ref string) (string, error) {
	evs, err := decodeAll(records)
	if err != nil {
		return "", err
	}
	return resolve(evs, ref)
}

func resolve(evs []decoded, ref string) (string, error) {
	// Every sandbox the journal names, each handle on the newest sandbox
	// committed or renamed with it, then the CLI's one matching rule.
	var refs []projections.Ref
	at := map[string]int{}
	for _, d := range evs {
		if d.ev.Sandbox == "" {
			continue
		}
		i, ok := at[d.ev.Sandbox]
		if !ok {
			i = len(refs)
			at[d.ev.Sandbox] = i
			refs = append(refs, projections.Ref{ID: d.ev.Sandbox})
		}
		if h := handleOf(d.ev.Payload); h != "" {
			for j := range refs {
				if refs[j].Handle == h {
					refs[j].Handle = ""
				}
			}
			refs[i].Handle = h
		}
	}
	id, err := projections.Match(refs, ref)
	if errors.Is(err, projections.ErrNoMatch) {
		return "", fmt.Errorf("no event names sandbox %q", ref)
	}
	return id, err
}

// handleOf is the handle p gives its sandbox (events.HandleOf): at its
// commit, or by a rename.
func handleOf(p events.Payload) string { return events.HandleOf(events.Event{Payload: p}) }

// Timeline returns every event of sandbox id, in journal order, including
// those of sagas run on its behalf.
func Timeline(records []Record, id string) ([]Entry, error) {
	evs, err := decodeAll(records)
	if err != nil {
		return nil, err
	}
	return timeline(evs, id), nil
}

// TimelineOf resolves ref (Resolve) and returns its Timeline, decoding the
// journal once for both.
func TimelineOf(records []Record, ref string) (string, []Entry, error) {
	evs, err := decodeAll(records)
	if err != nil {
		return "", nil, err
	}
	id, err := resolve(evs, ref)
	if err != nil {
		return "", nil, err
	}
	return id, timeline(evs, id), nil
}

func timeline(evs []decoded, id string) []Entry {
	out := []Entry{}
	for _, d := range evs {
		if d.ev.Sandbox != id {
			continue
		}
		out = append(out, Entry{Seq: d.seq, Time: d.ev.Time, Type: d.ev.Type, Sandbox: d.ev.Sandbox, Saga: d.ev.Saga,
			Step: d.ev.Step, ID: d.ev.ID.String(), Payload: d.ev.Payload})
	}
	return out
}

// Point selects a place in the journal: a sequence, or the last event at or
// before a time.
type Point struct {
	Seq  uint64    // 0 = not by sequence
	Time time.Time // zero = not by time
}

// State is the projections as they stood at a point.
type State struct {
	Seq       uint64                  `json:"seq"`
	Time      time.Time               `json:"time"`
	Sandboxes []*projections.Sandbox  `json:"sandboxes"`
	Ownership []projections.OwnedPath `json:"ownership"`
	Volumes   []*projections.Volume   `json:"volumes"`
	OpenSagas []*projections.OpenSaga `json:"open_sagas"`
}

// At folds every event up to p into fresh projections.
func At(records []Record, p Point) (State, error) {
	evs, err := decodeAll(records)
	if err != nil {
		return State{}, err
	}
	sbs, vols, sg := projections.NewSandboxes(), projections.NewVolumes(), projections.NewSagas()
	var st State
	for _, d := range evs {
		if (p.Seq != 0 && d.seq > p.Seq) || (!p.Time.IsZero() && d.ev.Time.After(p.Time)) {
			break
		}
		sbs.Apply(d.seq, d.ev)
		vols.Apply(d.seq, d.ev)
		sg.Apply(d.seq, d.ev)
		st.Seq, st.Time = d.seq, d.ev.Time
	}
	st.Sandboxes, st.Ownership, st.Volumes, st.OpenSagas = sbs.List(), sbs.Owned(), vols.List(), sg.Open()
	return st, nil
}
