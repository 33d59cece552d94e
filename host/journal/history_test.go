package journal

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"
)

// openListening opens a journal with a loopback listener and connects its
// subscriber identity over TCP, as an external program would.
func openListening(t *testing.T) (*Journal, *nats.Conn, chan error) {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	j, err := Open(context.Background(), Options{Dir: t.TempDir(), Listen: "127.0.0.1:0",
		Subscriber: &Credentials{User: "sub", PasswordHash: string(hash)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	asyncErrs := make(chan error, 64)
	nc, err := nats.Connect(j.ClientURL(), nats.UserInfo("sub", "secret"), nats.CustomInboxPrefix(ReplyPrefix),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case asyncErrs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return j, nc, asyncErrs
}

// history sends one request and collects the reply up to its end message.
func history(t *testing.T, nc *nats.Conn, req HistoryRequest) (seqs []uint64, end *nats.Msg) {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	body, _ := json.Marshal(req)
	if err := nc.PublishRequest(HistorySubject, inbox, body); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("history %+v: %v after %v", req, err, seqs)
		}
		if m.Header.Get(HistoryEndHeader) == "1" {
			return seqs, m
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil || len(m.Data) == 0 || !strings.HasPrefix(m.Header.Get(jetstream.SubjectHeader), "nexus.events.") {
			t.Fatalf("history message without a sequence, body or subject: %v %q", m.Header, m.Data)
		}
		seqs = append(seqs, seq)
	}
}

func TestHistoryServiceCatchesUpReadOnly(t *testing.T) {
	j, nc, asyncErrs := openListening(t)
	appendN(t, j, 0, 25) // seq i+1 on ...s<i%3>
	all := readAll(t, j, 1, Subjects)

	seqs, end := history(t, nc, HistoryRequest{Max: 10})
	if len(seqs) != 10 || seqs[0] != 1 || seqs[9] != 10 || end.Header.Get(HistoryLastHeader) != "25" {
		t.Fatalf("first page %v, last %q", seqs, end.Header.Get(HistoryLastHeader))
	}
	seqs, _ = history(t, nc, HistoryRequest{Since: 20, Filters: []string{"nexus.events.*.*.s1"}})
	if want := []uint64{20, 23}; len(seqs) != 2 || seqs[0] != want[0] || seqs[1] != want[1] {
		t.Fatalf("filtered page %v, want %v", seqs, want)
	}
	seqs, _ = history(t, nc, HistoryRequest{SinceTime: all[22].Time})
	if len(seqs) != 3 || seqs[0] != 23 {
		t.Fatalf("page since a time: %v", seqs)
	}
	if _, end := history(t, nc, HistoryRequest{Filters: []string{"$JS.API.>"}}); !strings.Contains(end.Header.Get(HistoryErrorHeader), "filter") {
		t.Fatalf("a filter outside the journal: %v", end.Header)
	}

	// Everything that would write is refused by the server: appends on
	// either subject space, the JetStream API (stream info, purge, delete,
	// a durable consumer or an ephemeral one), and subscribing to inboxes
	// other than its own prefix.
	durable, _ := json.Marshal(map[string]any{"stream_name": StreamName, "config": map[string]any{"durable_name": "d", "ack_policy": "explicit"}})
	for _, subject := range []string{
		"nexus.append.sandbox.created.s0", "nexus.events.sandbox.created.s0",
		"$JS.API.STREAM.INFO.NEXUS", "$JS.API.STREAM.PURGE.NEXUS", "$JS.API.STREAM.DELETE.NEXUS",
		"$JS.API.CONSUMER.CREATE.NEXUS.d", "$JS.API.CONSUMER.DURABLE.CREATE.NEXUS.d", "$JS.API.CONSUMER.CREATE.NEXUS",
	} {
		if err := nc.Publish(subject, durable); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, asyncErrs, subject)
	}
	if _, err := nc.SubscribeSync("_INBOX.>"); err != nil {
		t.Fatal(err)
	}
	wantViolation(t, asyncErrs, "_INBOX.>")

	// The service publishes as nexus: a reply subject steered at the
	// append subjects or the JetStream API gets no answer at all.
	for _, reply := range []string{"nexus.append.sandbox.created.s0", "$JS.API.STREAM.PURGE.NEXUS", ReplyPrefix + ".>"} {
		if err := nc.PublishRequest(HistorySubject, reply, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, end := history(t, nc, HistoryRequest{Since: 25}); end.Header.Get(HistoryLastHeader) != "25" {
		t.Fatalf("after the refused requests the journal ends at %q, want 25", end.Header.Get(HistoryLastHeader))
	}
	if got := readAll(t, j, 1, Subjects); len(got) != 25 {
		t.Fatalf("journal has %d records, want 25", len(got))
	}
	names := j.currentStream().ListConsumers(context.Background())
	for info := range names.Info() {
		if info.Config.Durable != "" {
			t.Fatalf("a durable consumer %q exists", info.Config.Durable)
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
}

func wantViolation(t *testing.T, asyncErrs chan error, subject string) {
	t.Helper()
	select {
	case err := <-asyncErrs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Fatalf("%s: async error %v, want a permissions violation naming it", subject, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s by the subscriber was not refused within 10s", subject)
	}
}
