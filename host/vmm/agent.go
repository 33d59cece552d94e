package vmm

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// agent stands in for the guest agent behind CH's vsock socket. Its line
// protocol: "ping" answers "pong", "flush" rewrites sector 0 of every
// writable disk (a superblock commit, refused as CH refuses it on a disk
// whose raw type was probed rather than given), fsyncs it and answers
// "flushed" (the host's proof that the guest's filesystems reached
// the disks). CH's own "CONNECT <port>" handshake is accepted as a first line
// and answered "OK <n>", so host code may speak it to both.
//
// While the VM is paused the agent reads but does not answer, as a frozen
// guest cannot: a host that asks the guest to flush after pausing it hangs
// here as it would on CH, instead of passing.
type agent struct {
	l     *unixsock.Listener
	disks []disk
	log   *logger
	done  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	resumed chan struct{} // nil while running; closed on resume
	conns   map[net.Conn]struct{}
	nextOK  int
}

func startAgent(path string, disks []disk, paused bool, log *logger) (*agent, error) {
	l, err := unixsock.Listen(path)
	if err != nil {
		return nil, err
	}
	a := &agent{l: l, disks: disks, log: log, done: make(chan struct{}), conns: map[net.Conn]struct{}{}, nextOK: 1 << 30}
	if paused {
		a.resumed = make(chan struct{})
	}
	a.wg.Add(1)
	go a.accept()
	return a, nil
}

func (a *agent) setPaused(paused bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case paused && a.resumed == nil:
		a.resumed = make(chan struct{})
	case !paused && a.resumed != nil:
		close(a.resumed)
		a.resumed = nil
	}
}

// close stops listening, drops every connection (as a VMM's exit does),
// removes the socket file and waits for the agent's goroutines, so no flush
// outlives the disks it syncs.
func (a *agent) close() {
	close(a.done)
	a.l.Close()
	a.mu.Lock()
	for c := range a.conns {
		c.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
}

func (a *agent) accept() {
	defer a.wg.Done()
	for {
		c, err := a.l.Accept()
		if err != nil {
			select {
			case <-a.done:
			default:
				a.log.Printf("vsock accept: %v", err)
			}
			return
		}
		a.mu.Lock()
		select {
		case <-a.done:
			a.mu.Unlock()
			c.Close()
			return
		default:
		}
		a.conns[c] = struct{}{}
		a.wg.Add(1)
		a.mu.Unlock()
		go a.serve(c)
	}
}

func (a *agent) serve(c net.Conn) {
	defer a.wg.Done()
	defer func() {
		a.mu.Lock()
		delete(a.conns, c)
		a.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReader(c)
	first := true
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if !a.waitRunning() {
			return
		}
		reply := a.answer(strings.TrimSpace(line), first)
		first = false
		if _, err := c.Write([]byte(reply + "\n")); err != nil {
			return
		}
	}
}

// waitRunning blocks while the VM is paused; false means the agent closed.
func (a *agent) waitRunning() bool {
	for {
		a.mu.Lock()
		ch := a.resumed
		a.mu.Unlock()
		if ch == nil {
			select {
			case <-a.done:
				return false
			default:
				return true
			}
		}
		select {
		case <-ch:
		case <-a.done:
			return false
		}
	}
}

func (a *agent) answer(line string, first bool) string {
	if port, ok := strings.CutPrefix(line, "CONNECT "); ok && first {
		if _, err := strconv.ParseUint(port, 10, 32); err != nil {
			return "error bad port " + strconv.Quote(port)
		}
		a.mu.Lock()
		n := a.nextOK
		a.nextOK++
		a.mu.Unlock()
		return "OK " + strconv.Itoa(n)
	}
	switch line {
	case "ping":
		return "pong"
	case "flush":
		for _, d := range a.disks {
			if !d.writable {
				continue
			}
			// The guest's filesystems commit their superblocks, which for
			// an ext4 with 4 KiB blocks rewrites sector 0.
			if err := writeGuestSector0(d); err != nil {
				a.log.Printf("vsock flush: %v", err)
				return fmt.Sprintf("error %v", err)
			}
			if err := d.f.Sync(); err != nil {
				a.log.Printf("vsock flush: %v", err)
				return fmt.Sprintf("error %v", err)
			}
		}
		return "flushed"
	}
	return "error unknown command " + strconv.Quote(line)
}
