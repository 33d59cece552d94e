package agentproto

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestAbandonedRequestDoesNotStallTheSession: a caller that gives up on a
// read while its data still streams (its writer failed) leaves the
// session usable: the next request is answered and Close returns. The
// frames of the abandoned read that arrive after it gave up are dropped,
// not handed to a caller that is gone (which blocked every later frame
// of the session, and Close, for good).
func TestAbandonedRequestDoesNotStallTheSession(t *testing.T) {
	host, guest := net.Pipe()
	go func() {
		for {
			m, err := Read(guest)
			if err != nil {
				guest.Close()
				return
			}
			switch m.Type {
			case THello:
				Write(guest, &Message{Type: THello, ID: m.ID, Version: Version})
			case TPing:
				Write(guest, &Message{Type: TOK, ID: m.ID})
			case TRead:
				for i := 0; i < 20; i++ {
					Write(guest, &Message{Type: TData, ID: m.ID, Ref: m.ID, Data: make([]byte, 1024)})
				}
				Write(guest, &Message{Type: TOK, ID: m.ID, Size: 20 * 1024})
			}
		}
	}()
	c := NewClient(host)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := c.Hello(ctx); err != nil {
		t.Fatal(err)
	}
	gaveUp := errors.New("gave up")
	if _, err := c.ReadFile(ctx, "/f", writerFunc(func(p []byte) (int, error) {
		// Long enough for the next frame to be routed to this read.
		time.Sleep(50 * time.Millisecond)
		return 0, gaveUp
	})); !errors.Is(err, gaveUp) {
		t.Fatalf("read: %v", err)
	}
	// If an abandoned request stalls the reader, the session is stuck for
	// good (even a send blocks:
	// the agent cannot write its next frame), so the rest runs beside a
	// deadline.
	after := make(chan error, 1)
	go func() {
		if err := c.Ping(ctx); err != nil {
			after <- err
			return
		}
		after <- c.Close()
	}()
	select {
	case err := <-after:
		if err != nil {
			t.Fatalf("ping and close after an abandoned read: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session is stuck after an abandoned read: no ping answer or Close within 10s")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
