package journal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers of JetStream's atomic batch publish (nats-server 2.12+); the
// client library has no constants for them.
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// MaxBatch is the most messages one AppendBatch takes: the server's default
// limit on an atomic batch.
const MaxBatch = 1000

// ErrBatchRefused means the server refused an atomic batch as a whole (an
// expectation did not hold, a message id was already stored, the space
// policy refused one of its messages): nothing of it is stored. The caller
// can append the messages one by one to learn which one was refused.
var ErrBatchRefused = errors.New("journal refused the batch")

// BatchError is the server's reason for refusing a batch. It wraps
// ErrBatchRefused.
type BatchError struct {
	Code        int // the server's JetStream error code, 0 if refused before publishing
	Description string
}

func (e *BatchError) Error() string {
	if e.Code == 0 {
		return fmt.Sprintf("%v: %s", ErrBatchRefused, e.Description)
	}
	return fmt.Sprintf("%v: %s (error %d)", ErrBatchRefused, e.Description, e.Code)
}

func (e *BatchError) Unwrap() error { return ErrBatchRefused }

// WrongLastSequence says whether an expectation of the batch did not hold:
// the stream's last sequence, or a subject's.
func (e *BatchError) WrongLastSequence() bool {
	return e.Code == int(jetstream.JSErrCodeStreamWrongLastSequence)
}

// batchAck is the server's answer to a batch's commit message.
type batchAck struct {
	Seq   uint64 `json:"seq"`
	Batch string `json:"batch"`
	Count int    `json:"count"`
	Error *struct {
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// AppendBatch stores msgs as one atomic batch: all of them at consecutive
// sequences, in order, or none, made durable by one fsync after the commit
// (sync.go). The server stages an R1 batch in a file store of its own,
// created and deleted per batch, which costs more than the fsync saved:
// use it where atomicity is the point, and AppendGroup for throughput.
//
// Every expectation of every message is checked against the journal as it
// was before the batch: only msgs[0] may carry ExpectLastSeq, and a message
// with ExpectSubjects may not follow a message of the same batch on those
// subjects (the server would check it against the stored records, not the
// staged ones). If any expectation fails, or any message id is already
// stored, the whole batch is refused with a *BatchError (ErrBatchRefused)
// and nothing is stored; Append each message to learn which.
func (j *Journal) AppendBatch(ctx context.Context, msgs []Message) ([]Ack, error) {
	if err := checkBatch(msgs); err != nil {
		return nil, err
	}
	j.wmu.Lock()
	defer j.wmu.Unlock()
	reserve := true
	for _, m := range msgs {
		reserve = reserve && m.Reserve
	}
	if err := j.checkSpace(reserve); err != nil {
		// Appended one by one, the messages that free space still go in.
		return nil, fmt.Errorf("%w: %w", &BatchError{Description: "space policy"}, err)
	}
	if j.broken != "" {
		if err := j.reopenStore(ctx); err != nil {
			return nil, fmt.Errorf("journal batch of %d: %w", len(msgs), err)
		}
	}
	id, err := batchID()
	if err != nil {
		return nil, err
	}
	last := len(msgs) - 1
	for i, m := range msgs {
		hdr := nats.Header{}
		hdr.Set(jetstream.MsgIDHeader, m.ID)
		hdr.Set(jetstream.ExpectedStreamHeader, StreamName)
		hdr.Set(batchIDHeader, id)
		hdr.Set(batchSeqHeader, strconv.Itoa(i+1))
		if m.ExpectLastSeq != nil {
			hdr.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(*m.ExpectLastSeq, 10))
		}
		if m.ExpectSubjects != "" {
			hdr.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(m.ExpectSubjectSeq, 10))
			hdr.Set(expectedLastSubjSeqSubjHeader, m.ExpectSubjects)
		}
		msg := &nats.Msg{Subject: AppendSubject(m.Subject), Data: m.Data, Header: hdr}
		if i < last {
			// Staged without a reply: a message the server cannot stage
			// makes the commit fail as an incomplete batch.
			if err := j.nc.PublishMsg(msg); err != nil {
				return nil, j.failedAppend(m.ID, err)
			}
			continue
		}
		hdr.Set(batchCommitHeader, "1")
		var resp *nats.Msg
		err := j.awaitAnswer(ctx, func(ctx context.Context) (err error) {
			resp, err = j.nc.RequestMsgWithContext(ctx, msg)
			return err
		})
		if err != nil {
			return nil, j.failedAppend(m.ID, err)
		}
		var ack batchAck
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return nil, fmt.Errorf("journal batch %s: bad acknowledgement %q: %w", id, resp.Data, err)
		}
		if ack.Error != nil {
			return nil, &BatchError{Code: ack.Error.ErrCode, Description: ack.Error.Description}
		}
		if ack.Batch != id || ack.Count != len(msgs) || ack.Seq < uint64(len(msgs)) {
			return nil, fmt.Errorf("journal batch %s of %d: acknowledged as batch %q of %d ending at %d", id, len(msgs), ack.Batch, ack.Count, ack.Seq)
		}
		noteStored(&j.synced.stored, ack.Seq)
		if err := j.syncStore(); err != nil {
			return nil, j.failedAppend(m.ID, err)
		}
		// The server commits a batch under its isolation lock, so its
		// messages hold consecutive sequences ending at the acknowledged one.
		acks := make([]Ack, len(msgs))
		first := ack.Seq - uint64(len(msgs)) + 1
		for k := range acks {
			acks[k] = Ack{Seq: first + uint64(k)}
		}
		return acks, nil
	}
	panic("unreachable: the last message commits the batch")
}

func checkBatch(msgs []Message) error {
	if len(msgs) == 0 || len(msgs) > MaxBatch {
		return fmt.Errorf("journal batch: %d messages, want 1 to %d", len(msgs), MaxBatch)
	}
	for i, m := range msgs {
		if m.ID == "" {
			return fmt.Errorf("journal batch: message %d: message id is required", i)
		}
		if i > 0 && m.ExpectLastSeq != nil {
			return fmt.Errorf("journal batch: message %d: only the first message may expect the stream's last sequence", i)
		}
		if m.ExpectSubjects == "" {
			continue
		}
		for _, prev := range msgs[:i] {
			if subjectMatches(m.ExpectSubjects, prev.Subject) {
				return fmt.Errorf("journal batch: message %d expects %s, which message %s of the same batch writes", i, m.ExpectSubjects, prev.ID)
			}
		}
	}
	return nil
}

// subjectMatches reports whether the NATS subject matches filter ('*' is
// one token, a final '>' one or more).
func subjectMatches(filter, subject string) bool {
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

func batchID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("journal batch id: %w", err)
	}
	return hex.EncodeToString(b), nil
}
