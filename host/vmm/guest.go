package vmm

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// GuestAgentPort is the guest vsock port the guest agent listens on.
const GuestAgentPort = 1024

// GuestFlush asks the guest agent, through the VM's vsock socket, to flush
// its filesystems, and returns nil only when the agent confirms. A nil
// return is what entitles the host to journal a flush acknowledgement.
func GuestFlush(ctx context.Context, vsockSocket string) error {
	conn, err := unixsock.Dial(ctx, vsockSocket)
	if err != nil {
		return fmt.Errorf("guest flush: %w", err)
	}
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	conn.SetDeadline(deadline)
	// Cloud Hypervisor's vsock socket first routes the connection to a
	// guest port ("CONNECT <port>" -> "OK <n>"); the process driver's agent
	// speaks the same handshake.
	r := bufio.NewReader(conn)
	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", GuestAgentPort); err != nil {
		return fmt.Errorf("guest flush: %w", err)
	}
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "OK ") {
		return fmt.Errorf("guest flush: vsock handshake to port %d: %q %v", GuestAgentPort, strings.TrimSpace(line), err)
	}
	if _, err := conn.Write([]byte("flush\n")); err != nil {
		return fmt.Errorf("guest flush: %w", err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("guest flush: %w", err)
	}
	if strings.TrimSpace(line) != "flushed" {
		return fmt.Errorf("guest flush: agent answered %q", strings.TrimSpace(line))
	}
	return nil
}
