package vmm

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// GuestAgentPort is the guest vsock port the guest agent listens on.
const GuestAgentPort = agentproto.Port

// DefaultFlushDeadline is how long a flush waits for the agent's answer,
// and how long the guest stays frozen after it unless the VMM is gone first.
const DefaultFlushDeadline = 10 * time.Second

// DialAgent opens a session with the guest agent through the sandbox's
// vsock socket: CH's hybrid-vsock handshake ("CONNECT 1024" -> "OK <n>"),
// then hello. Every VMM nexus drives answers the same handshake on that
// path (docs/guest-agent.md), so callers never branch on the transport.
// ctx bounds the handshake; the session lives until Close.
func DialAgent(ctx context.Context, vsockSocket string) (*agentproto.Client, error) {
	conn, err := unixsock.Dial(ctx, vsockSocket)
	if err != nil {
		return nil, fmt.Errorf("guest agent: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", GuestAgentPort); err != nil {
		conn.Close()
		return nil, fmt.Errorf("guest agent: %w", err)
	}
	line, err := ReadHandshakeLine(conn)
	if err != nil || !strings.HasPrefix(line, "OK ") {
		conn.Close()
		return nil, fmt.Errorf("guest agent: vsock handshake to port %d: %q %v (no agent listening)", GuestAgentPort, line, err)
	}
	conn.SetDeadline(time.Time{})
	c := agentproto.NewClient(conn)
	if _, _, err := c.Hello(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("guest agent: %w", err)
	}
	return c, nil
}

// ReadHandshakeLine reads one line of CH's hybrid-vsock handshake
// ("CONNECT <port>", "OK <n>") a byte at a time: whatever follows it
// belongs to the protocol's frames and must stay unread.
func ReadHandshakeLine(r io.Reader) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for len(b) < 128 {
		if _, err := io.ReadFull(r, one); err != nil {
			return string(b), err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
	return string(b), fmt.Errorf("handshake line longer than %d bytes", len(b))
}

// GuestFlush asks the guest agent to flush (sync and freeze every writable
// nexus filesystem; frozen until deadline unless the VMM is gone first) and
// returns nil only when the agent confirmed. A nil return is what entitles
// the host to journal a flush acknowledgement.
func GuestFlush(ctx context.Context, vsockSocket string, deadline time.Duration) error {
	if deadline <= 0 {
		deadline = DefaultFlushDeadline
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	c, err := DialAgent(ctx, vsockSocket)
	if err != nil {
		return fmt.Errorf("guest flush: %w", err)
	}
	defer c.Close()
	if _, err := c.Flush(ctx, deadline); err != nil {
		return fmt.Errorf("guest flush: %w", err)
	}
	return nil
}
