package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Subscribers catch up on what they missed through a request/reply
// service nexus answers, not through the JetStream API: a consumer-create
// permission cannot tell an ephemeral consumer from a durable one (the
// durable name is in the request body), so granting it would let a
// subscriber write consumer state into the store. Here nexus reads, and
// the subscriber can only ask.
const (
	// HistorySubject is where a subscriber sends a HistoryRequest.
	HistorySubject = "nexus.history"
	// ReplyPrefix is the only reply subject space the service answers on,
	// and the subscriber's inbox prefix (nats.CustomInboxPrefix). Any other
	// reply subject is refused: the service publishes with nexus's own
	// identity, which must never be steered onto the append subjects.
	ReplyPrefix = "nexus.reply"
	// HistoryMax bounds one reply, so a reply never outruns a slow reader.
	HistoryMax = 1000

	// Headers of a history reply's last message, which has no body.
	HistoryEndHeader   = "Nexus-History-End"   // "1"
	HistoryLastHeader  = "Nexus-Last-Sequence" // the journal's last sequence when the reply was read
	HistoryErrorHeader = "Nexus-History-Error" // why the request was refused
)

// HistoryRequest asks for stored events in sequence order.
type HistoryRequest struct {
	Since     uint64    `json:"since,omitempty"`     // first sequence (0: the start)
	SinceTime time.Time `json:"since_time,omitzero"` // or the first stored at or after this time
	Filters   []string  `json:"filters,omitempty"`   // subject filters under nexus.events (none: all)
	Max       int       `json:"max,omitempty"`       // at most this many (0 or more than HistoryMax: HistoryMax)
}

// serveHistory answers on HistorySubject for as long as the journal is open.
func (j *Journal) serveHistory() error {
	_, err := j.nc.Subscribe(HistorySubject, func(m *nats.Msg) {
		if !strings.HasPrefix(m.Reply, ReplyPrefix+".") || !server.IsValidLiteralSubject(m.Reply) {
			return // nowhere it may answer: the request is dropped
		}
		end := nats.NewMsg(m.Reply)
		end.Header.Set(HistoryEndHeader, "1")
		last, err := j.replyHistory(m)
		if err != nil {
			end.Header.Set(HistoryErrorHeader, err.Error())
		}
		end.Header.Set(HistoryLastHeader, strconv.FormatUint(last, 10))
		j.nc.PublishMsg(end)
	})
	if err != nil {
		return fmt.Errorf("journal: history service: %w", err)
	}
	return nil
}

func (j *Journal) replyHistory(m *nats.Msg) (uint64, error) {
	var req HistoryRequest
	if err := json.Unmarshal(m.Data, &req); err != nil && len(m.Data) > 0 {
		return 0, fmt.Errorf("request: %v", err)
	}
	prefix := strings.TrimSuffix(Subjects, ">")
	for _, f := range req.Filters {
		if !strings.HasPrefix(f, prefix) || !server.IsValidSubject(f) {
			return 0, fmt.Errorf("filter %q: want a subject under %s", f, Subjects)
		}
	}
	if req.Max <= 0 || req.Max > HistoryMax {
		req.Max = HistoryMax
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	last, err := j.LastSeq(ctx)
	if err != nil {
		return 0, err
	}
	r := Range{From: req.Since, FromTime: req.SinceTime, To: last, Filters: req.Filters, Limit: req.Max}
	err = j.Scan(ctx, r, func(rec Record) error {
		out := nats.NewMsg(m.Reply)
		out.Data = rec.Data
		out.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(rec.Seq, 10))
		out.Header.Set(jetstream.SubjectHeader, rec.Subject)
		out.Header.Set(jetstream.TimeStampHeaer, rec.Time.UTC().Format(time.RFC3339Nano))
		out.Header.Set(jetstream.MsgIDHeader, rec.MsgID)
		return j.nc.PublishMsg(out)
	})
	if err != nil && !errors.Is(err, errStop) {
		return last, err
	}
	return last, nil
}
