// Command subscriber-go is a nexus subscriber in Go: it follows the
// journal over NATS and prints one JSON line per event, in sequence order,
// with no gap and no duplicate, across reconnects (docs/events.md).
//
//	go run ./examples/subscriber-go <state-root>/subscriber.json
//
// NEXUS_SINCE=N resumes after sequence N; NEXUS_PAGE sets the history page.
package main

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nexus-sandbox/nexus/events"
)

// credentials is what a daemon started with --listen writes to
// <state-root>/subscriber.json.
type credentials struct {
	URL         string `json:"url"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Subjects    string `json:"subjects"`
	History     string `json:"history"`
	InboxPrefix string `json:"inbox_prefix"`
}

// line is what the subscriber prints of each event.
type line struct {
	Seq     uint64 `json:"seq"`
	Subject string `json:"subject"`
	ID      string `json:"id"` // the ULID's 16 bytes in hex
	Type    string `json:"type"`
	Schema  uint16 `json:"schema"`
	Sandbox string `json:"sandbox"`
	TS      string `json:"ts"` // nanoseconds since the Unix epoch
}

// follower holds the last sequence printed. Only main's loop touches it,
// so live messages and history pages never interleave.
type follower struct {
	nc   *nats.Conn
	cred credentials
	page int
	last uint64
	out  *json.Encoder
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: subscriber-go <state-root>/subscriber.json")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "subscriber-go:", err)
		os.Exit(1)
	}
}

func run(credsFile string) error {
	data, err := os.ReadFile(credsFile)
	if err != nil {
		return err
	}
	f := &follower{page: 1000, out: json.NewEncoder(os.Stdout)}
	if err := json.Unmarshal(data, &f.cred); err != nil {
		return fmt.Errorf("%s: %w", credsFile, err)
	}
	f.cred.History = cmp.Or(f.cred.History, "nexus.history")
	f.cred.InboxPrefix = cmp.Or(f.cred.InboxPrefix, "nexus.reply")
	f.cred.Subjects = cmp.Or(f.cred.Subjects, "nexus.events.>")
	if s := os.Getenv("NEXUS_PAGE"); s != "" {
		if f.page, err = strconv.Atoi(s); err != nil || f.page < 1 {
			return fmt.Errorf("NEXUS_PAGE=%q: want a positive number", s)
		}
	}
	if s := os.Getenv("NEXUS_SINCE"); s != "" {
		if f.last, err = strconv.ParseUint(s, 10, 64); err != nil {
			return fmt.Errorf("NEXUS_SINCE=%q: want a sequence", s)
		}
	}

	reconnected := make(chan struct{}, 1)
	f.nc, err = nats.Connect(f.cred.URL, nats.UserInfo(f.cred.User, f.cred.Password),
		nats.CustomInboxPrefix(f.cred.InboxPrefix),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ReconnectHandler(func(*nats.Conn) {
			select {
			case reconnected <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		return err
	}
	defer f.nc.Close()
	// Subscribe to live events first, then page through history: an event
	// stored between the two arrives both ways and is printed once.
	live := make(chan *nats.Msg, 4096)
	if _, err := f.nc.ChanSubscribe(f.cred.Subjects, live); err != nil {
		return err
	}
	f.retry()
	fmt.Fprintf(os.Stderr, "caught up at %d\n", f.last)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	// Besides a reconnect, ask history every second: events journaled
	// while no server listened arrive only this way, and a client can be
	// back before the server answers history.
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		select {
		case m := <-live:
			if !f.apply(m) {
				f.retry() // a gap: fetch it, then m is a duplicate or the next
				f.apply(m)
			}
		case <-reconnected:
			f.retry()
		case <-poll.C:
			f.retry()
		case <-stop:
			return f.nc.Drain()
		}
	}
}

// apply prints m if it is the next event; false means a gap before it.
func (f *follower) apply(m *nats.Msg) bool {
	seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "a message on %s without a sequence: skipped\n", m.Subject)
		return true
	}
	if seq <= f.last {
		return true // already printed: live and history overlap
	}
	if seq != f.last+1 {
		return false
	}
	e, err := events.Decode(m.Data)
	if err != nil {
		// An event this build cannot read (a newer envelope): say so and
		// go on, as docs/events.md asks of a reader.
		fmt.Fprintf(os.Stderr, "sequence %d: %v: skipped\n", seq, err)
		f.last = seq
		return true
	}
	f.out.Encode(line{
		Seq: seq, Subject: cmp.Or(m.Header.Get("Nats-Subject"), m.Subject),
		ID: hex.EncodeToString(e.ID[:]), Type: string(e.Type), Schema: e.Schema, Sandbox: e.Sandbox,
		TS: strconv.FormatInt(e.Time.UnixNano(), 10),
	})
	f.last = seq
	return true
}

// retry catches up, again and again while the server is away (a page then
// goes unanswered), until the connection is closed.
func (f *follower) retry() {
	for !f.nc.IsClosed() {
		err := f.catchUp()
		if err == nil {
			return
		}
		fmt.Fprintln(os.Stderr, "catch-up:", err)
		time.Sleep(200 * time.Millisecond)
	}
}

// catchUp pages through history from the last sequence printed until a
// page comes back short.
func (f *follower) catchUp() error {
	for {
		n, err := f.historyPage()
		if err != nil || n < f.page {
			return err
		}
	}
}

// historyPage asks for one page and applies it, returning how many events
// it held. A page whose end marker does not come within 5 s of silence is
// given up: its subscription may have outlived a reconnect.
func (f *follower) historyPage() (int, error) {
	inbox := f.nc.NewInbox()
	sub, err := f.nc.SubscribeSync(inbox)
	if err != nil {
		return 0, err
	}
	defer sub.Unsubscribe()
	req, _ := json.Marshal(map[string]any{"since": f.last + 1, "max": f.page})
	if err := f.nc.PublishMsg(&nats.Msg{Subject: f.cred.History, Reply: inbox, Data: req}); err != nil {
		return 0, err
	}
	n := 0
	for {
		m, err := sub.NextMsg(5 * time.Second)
		if errors.Is(err, nats.ErrTimeout) {
			return n, fmt.Errorf("history: no answer for 5 s after %d", f.last)
		}
		if err != nil {
			return n, err
		}
		if m.Header.Get("Nexus-History-End") == "1" {
			if e := m.Header.Get("Nexus-History-Error"); e != "" {
				return n, errors.New("history: " + e)
			}
			return n, nil
		}
		if !f.apply(m) {
			return n, fmt.Errorf("history skipped a sequence after %d", f.last)
		}
		n++
	}
}
