package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// A client of the HTTP append (an older nexus) is refused with a reason it
// prints, in the JSON answer it decodes, and nothing is appended.
func TestAppendOverHTTPIsRefusedWithAReason(t *testing.T) {
	d := startDaemon(t, "")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return unixsock.Dial(ctx, filepath.Join(d.root, wire.SocketName))
	}}}
	// The body an older client sent: the event's journal bytes, base64 in JSON.
	body := []byte(`{"events":["gqF0"]}`)
	resp, err := hc.Post("http://nexus/v1/append", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Seqs  []uint64 `json:"seqs"`
		Error string   `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("the refusal is not the JSON an older client decodes: %v", err)
	}
	if resp.StatusCode != http.StatusUpgradeRequired || !strings.Contains(out.Error, "older nexus") || len(out.Seqs) != 0 {
		t.Fatalf("HTTP append answered %s %+v; want 426 naming the older nexus", resp.Status, out)
	}
	if recs := allEvents(t, connect(t, d.root)); len(recs) != 0 {
		t.Fatalf("a refused HTTP append stored %d events", len(recs))
	}
}

// A daemon without the append stream (an older nexus) is named as such,
// and an upgrade to another stream version is refused, not misread.
func TestAppendStreamVersionMismatch(t *testing.T) {
	sock := filepath.Join(t.TempDir(), wire.SocketName)
	ln, err := unixsock.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	old := &http.Server{Handler: http.NewServeMux()} // answers 404 to everything
	go old.Serve(ln)
	t.Cleanup(func() { old.Close() })
	c := control.NewClient(sock)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.Append(ctx, volumeEvent(1))
	if err == nil || !strings.Contains(err.Error(), "older nexus") {
		t.Fatalf("append to a daemon without the stream: %v; want it named an older nexus", err)
	}

	d := startDaemon(t, "")
	conn, err := unixsock.Dial(ctx, filepath.Join(d.root, wire.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /v1/append-stream HTTP/1.1\r\nHost: nexus\r\nConnection: Upgrade\r\nUpgrade: nexus-append/9\r\nContent-Length: 0\r\n\r\n")
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	reply, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusUpgradeRequired || !strings.Contains(string(reply), "nexus-append/2") {
		t.Fatalf("upgrade to another stream version answered %s %q; want 426 naming the version spoken", resp.Status, reply)
	}
}

// The append stream carries every answer a local append gives: sequences,
// a stale decision as *core.StaleError with its fields, a closed saga as
// core.ErrSagaClosed; and one client's concurrent appends, pipelined on
// its one connection, each get their own answer.
func TestAppendStreamAnswers(t *testing.T) {
	d := startDaemon(t, "")
	b := connect(t, d.root)
	ctx := context.Background()
	sb := ulid.Make().String()
	created := events.New(ulid.Make(), time.Now(), sb, events.SandboxCreatedEvent{Image: "i", Driver: "process"})
	seqs, err := b.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(sb), Seq: 0}}, created)
	if err != nil || len(seqs) != 1 || seqs[0] != 1 {
		t.Fatalf("first append: %v, %v", seqs, err)
	}
	warn := events.New(ulid.Make(), time.Now(), sb, events.WarningRaisedEvent{Reason: "stale"})
	_, err = b.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(sb), Seq: 0}}, warn)
	var stale *core.StaleError
	if !errors.As(err, &stale) || stale.Entity != core.Sandbox(sb) || stale.Expected != 0 || stale.Actual != 1 || stale.Latest != events.SandboxCreated {
		t.Fatalf("stale append through the stream: %v (%+v)", err, stale)
	}
	closed := events.New(ulid.Make(), time.Now(), sb, events.WarningRaisedEvent{Reason: "late"})
	closed.Saga, closed.Step = ulid.Make().String(), "x"
	if _, err := b.Append(ctx, closed); !errors.Is(err, core.ErrSagaClosed) {
		t.Fatalf("event of a saga never started: %v; want ErrSagaClosed", err)
	}

	const concurrent = 64
	got := make([]uint64, concurrent)
	var wg sync.WaitGroup
	for i := range concurrent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seqs, err := b.Append(ctx, volumeEvent(i))
			if err != nil || len(seqs) != 1 {
				t.Errorf("concurrent append %d: %v, %v", i, seqs, err)
				return
			}
			got[i] = seqs[0]
		}()
	}
	wg.Wait()
	recs := allEvents(t, b)
	bySeq := map[uint64]events.Event{}
	for _, r := range recs {
		bySeq[r.Seq] = r.Event
	}
	seen := map[uint64]bool{}
	for i, seq := range got {
		e, ok := bySeq[seq]
		if seen[seq] || !ok || e.Payload.(events.VolumeCreatedEvent).SizeBytes != int64(i)<<20 {
			t.Fatalf("concurrent append %d answered seq %d, which holds %+v", i, seq, e)
		}
		seen[seq] = true
	}
}

// A command that only appends holds the daemon by its append stream alone
// (a hijacked connection is out of the HTTP server's count): an idling
// daemon stays while the stream is open, and exits once it is closed.
func TestAppendStreamHoldsAnIdlingDaemon(t *testing.T) {
	root, done := runDaemon(t, daemon.Options{Idle: 200 * time.Millisecond, Auto: true})
	c := control.NewClient(filepath.Join(root, wire.SocketName)) // no HTTP request, no daemon started for it
	ctx := context.Background()
	if _, err := c.Append(ctx, volumeEvent(1)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // five idle periods, the stream open
	select {
	case err := <-done:
		done <- err
		t.Fatalf("daemon left a client whose append stream is open: %v", err)
	default:
	}
	if _, err := c.Append(ctx, volumeEvent(2)); err != nil {
		t.Fatalf("append after five idle periods: %v", err)
	}
	c.Close()
	wantExit(t, done, "after its last client closed its append stream")
}
