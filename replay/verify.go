// Package replay audits a journal after the fact. Verify is the first
// piece: given the journal's records in order, it says whether they decode,
// whether the sequence is continuous, whether any message id repeats, and
// which sagas never finished. It is pure: records in, report out.
package replay

import (
	"errors"
	"fmt"

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
}

// OK reports a journal with no gap, no repeated id and nothing unreadable.
func (r Report) OK() bool {
	return len(r.Gaps) == 0 && len(r.DuplicateID) == 0 && len(r.Undecodable) == 0 && len(r.NewerSchema) == 0
}

// Verify checks records, which must be given in stored order.
func Verify(records []Record) Report {
	rep := Report{Gaps: []string{}, DuplicateID: []string{}, Undecodable: []string{}, NewerSchema: []string{}}
	seen := make(map[string]uint64, len(records))
	sagas := projections.NewSagas()
	var last uint64
	for _, r := range records {
		rep.Events++
		if r.Seq != last+1 {
			rep.Gaps = append(rep.Gaps, fmt.Sprintf("%d..%d", last+1, r.Seq-1))
		}
		last = r.Seq
		if first, dup := seen[r.MsgID]; dup {
			rep.DuplicateID = append(rep.DuplicateID, fmt.Sprintf("%s at %d and %d", r.MsgID, first, r.Seq))
		} else {
			seen[r.MsgID] = r.Seq
		}
		e, err := events.Decode(r.Data)
		switch {
		case errors.Is(err, events.ErrSchemaTooNew):
			rep.NewerSchema = append(rep.NewerSchema, fmt.Sprintf("%d: %v", r.Seq, err))
			continue
		case err != nil:
			rep.Undecodable = append(rep.Undecodable, fmt.Sprintf("%d: %v", r.Seq, err))
			continue
		}
		sagas.Apply(r.Seq, e)
	}
	for _, sg := range sagas.Open() {
		rep.OpenSagas = append(rep.OpenSagas, *sg)
	}
	return rep
}
