package vmm

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/host/unixsock"
)

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
	if _, err := conn.Write([]byte("flush\n")); err != nil {
		return fmt.Errorf("guest flush: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("guest flush: %w", err)
	}
	if strings.TrimSpace(line) != "flushed" {
		return fmt.Errorf("guest flush: agent answered %q", strings.TrimSpace(line))
	}
	return nil
}
