package projections

import (
	"sort"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/events"
)

// OpenSaga is a saga the journal shows started but neither finished nor
// compensated: recover resumes or compensates it.
type OpenSaga struct {
	ID      string          `msgpack:"id" json:"id"`
	Kind    events.SagaKind `msgpack:"kind" json:"kind"`
	Sandbox string          `msgpack:"sb,omitempty" json:"sandbox,omitempty"`
	Steps   []string        `msgpack:"steps" json:"steps"`
	Done    []string        `msgpack:"done,omitempty" json:"done"`
	Started uint64          `msgpack:"started" json:"started_seq"`
}

// Sagas is the set of open sagas.
type Sagas struct {
	seq  uint64
	open map[string]*OpenSaga
}

// NewSagas returns an empty view.
func NewSagas() *Sagas { return &Sagas{open: map[string]*OpenSaga{}} }

func (*Sagas) Name() string  { return "sagas" }
func (s *Sagas) Seq() uint64 { return s.seq }

// Get returns the open saga with id, or nil.
func (s *Sagas) Get(id string) *OpenSaga { return s.open[id] }

// Open lists open sagas, oldest first.
func (s *Sagas) Open() []*OpenSaga {
	out := make([]*OpenSaga, 0, len(s.open))
	for _, sg := range s.open {
		out = append(out, sg)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started < out[j].Started })
	return out
}

func (s *Sagas) Apply(seq uint64, e events.Event) {
	s.seq = seq
	if e.Saga == "" {
		return
	}
	switch p := e.Payload.(type) {
	case events.SagaStartedEvent:
		s.open[e.Saga] = &OpenSaga{ID: e.Saga, Kind: p.Kind, Sandbox: e.Sandbox, Steps: p.Steps, Started: seq}
	case events.SagaFinishedEvent, events.SagaCompensatedEvent:
		delete(s.open, e.Saga)
	default:
		if sg := s.open[e.Saga]; sg != nil && e.Step != "" && !contains(sg.Done, e.Step) {
			sg.Done = append(sg.Done, e.Step)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (s *Sagas) MarshalState() ([]byte, error) { return msgpack.Marshal(s.Open()) }

func (s *Sagas) UnmarshalState(seq uint64, data []byte) error {
	var list []*OpenSaga
	if err := events.StrictUnmarshal(data, &list); err != nil {
		return err
	}
	open := make(map[string]*OpenSaga, len(list))
	for _, sg := range list {
		open[sg.ID] = sg
	}
	s.seq, s.open = seq, open
	return nil
}
