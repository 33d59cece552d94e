// Package replay audits a journal after the fact. Verify is the first
// piece: given the journal's records in order, it says whether they decode,
// whether the sequence is continuous, whether any message id repeats, and
// which sagas never finished. It is pure: records in, report out.
package replay

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// Record is one stored journal message.
type Record struct {
	Seq   uint64
	MsgID string
	Data  []byte
}

// Report is what Verify found. OK is true when nothing is wrong; open sagas
// alone do not make a journal damaged, but they are listed.
type Report struct {
	Events      int                    `json:"events"`
	Gaps        []string               `json:"gaps"`
	DuplicateID []string               `json:"duplicate_ids"`
	Undecodable []string               `json:"undecodable"`
	NewerSchema []string               `json:"newer_schema"`
	OpenSagas   []projections.OpenSaga `json:"open_sagas"`
	// OutsideSaga lists events recorded in the name of a saga that was not
	// open at that point (closed already, or never started): a write the
	// guard should have refused.
	OutsideSaga []string `json:"outside_saga"`
	// SharedHandles lists events that gave a sandbox a handle another live
	// sandbox held: two live sandboxes with one handle, which admission
	// should have refused.
	SharedHandles []string `json:"shared_handles"`
}

// OK reports a journal with no gap, no repeated id and nothing unreadable.
func (r Report) OK() bool {
	return len(r.Gaps) == 0 && len(r.DuplicateID) == 0 && len(r.Undecodable) == 0 && len(r.NewerSchema) == 0 && len(r.OutsideSaga) == 0 &&
		len(r.SharedHandles) == 0
}

// Verifier checks records one at a time, in stored order, so a journal of
// any length is verified in constant memory apart from the id set.
type Verifier struct {
	rep   Report
	seen  idSet
	sagas *projections.Sagas
	last  uint64
	// handles maps each live sandbox's handle to the sandboxes holding
	// it; handleOf is the other way round.
	handles  map[string][]string
	handleOf map[string]string
}

// NewVerifier returns an empty Verifier.
func NewVerifier() *Verifier {
	return &Verifier{
		rep:  Report{Gaps: []string{}, DuplicateID: []string{}, Undecodable: []string{}, NewerSchema: []string{}, OutsideSaga: []string{}, SharedHandles: []string{}},
		seen: newIDSet(), sagas: projections.NewSagas(),
		handles: map[string][]string{}, handleOf: map[string]string{},
	}
}

// Add checks the next record.
func (v *Verifier) Add(r Record) {
	v.rep.Events++
	if r.Seq != v.last+1 {
		v.rep.Gaps = append(v.rep.Gaps, fmt.Sprintf("%d..%d", v.last+1, r.Seq-1))
	}
	v.last = r.Seq
	if first, dup := v.seen.add(r.MsgID, r.Seq); dup {
		v.rep.DuplicateID = append(v.rep.DuplicateID, fmt.Sprintf("%s at %d and %d", r.MsgID, first, r.Seq))
	}
	e, err := events.Decode(r.Data)
	switch {
	case errors.Is(err, events.ErrSchemaTooNew):
		v.rep.NewerSchema = append(v.rep.NewerSchema, fmt.Sprintf("%d: %v", r.Seq, err))
		return
	case err != nil:
		v.rep.Undecodable = append(v.rep.Undecodable, fmt.Sprintf("%d: %v", r.Seq, err))
		return
	}
	if e.Saga != "" && e.Type != events.SagaStarted && v.sagas.Get(e.Saga) == nil {
		v.rep.OutsideSaga = append(v.rep.OutsideSaga, fmt.Sprintf("%d: %s of saga %s, which is not open", r.Seq, e.Type, e.Saga))
	}
	v.sagas.Apply(r.Seq, e)
	v.checkHandle(r.Seq, e)
}

// checkHandle follows which live sandbox holds which handle, and reports
// an event giving a handle another live sandbox holds.
func (v *Verifier) checkHandle(seq uint64, e events.Event) {
	if e.Type == events.SandboxRemoved {
		if h, ok := v.handleOf[e.Sandbox]; ok {
			delete(v.handleOf, e.Sandbox)
			v.handles[h] = slices.DeleteFunc(v.handles[h], func(id string) bool { return id == e.Sandbox })
			if len(v.handles[h]) == 0 {
				delete(v.handles, h)
			}
		}
		return
	}
	h := events.HandleOf(e)
	if h == "" || v.handleOf[e.Sandbox] == h {
		return
	}
	if holders := v.handles[h]; len(holders) > 0 {
		v.rep.SharedHandles = append(v.rep.SharedHandles, fmt.Sprintf("%d: %s gave sandbox %s handle %q, which live sandbox %s holds", seq, e.Type, e.Sandbox, h, strings.Join(holders, ", ")))
	}
	v.handleOf[e.Sandbox] = h
	v.handles[h] = append(v.handles[h], e.Sandbox)
}

// Report is what the records added so far show.
func (v *Verifier) Report() Report {
	rep := v.rep
	rep.OpenSagas = nil
	for _, sg := range v.sagas.Open() {
		rep.OpenSagas = append(rep.OpenSagas, *sg)
	}
	return rep
}

// Verify checks records, which must be given in stored order.
func Verify(records []Record) Report {
	v := NewVerifier()
	for _, r := range records {
		v.Add(r)
	}
	return v.Report()
}

// verifyBatch is how many records travel together to the verifying
// goroutine: large enough that the channel costs nothing per record.
const verifyBatch = 512

// Concurrent runs v on its own goroutine, so decoding and checking overlap
// reading the journal (which costs a core of its own on the consumer side).
// add must be called from one goroutine, in stored order; finish returns
// the report once every added record has been checked.
func (v *Verifier) Concurrent() (add func(Record), finish func() Report) {
	batches := make(chan []Record, 4)
	done := make(chan struct{})
	go func() {
		for b := range batches {
			for _, r := range b {
				v.Add(r)
			}
		}
		close(done)
	}()
	batch := make([]Record, 0, verifyBatch)
	add = func(r Record) {
		batch = append(batch, r)
		if len(batch) == verifyBatch {
			batches <- batch
			batch = make([]Record, 0, verifyBatch)
		}
	}
	finish = func() Report {
		if len(batch) > 0 {
			batches <- batch
		}
		close(batches)
		<-done
		return v.Report()
	}
	return add, finish
}
