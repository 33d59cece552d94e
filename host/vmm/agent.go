package vmm

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// agent stands in for the guest agent behind CH's vsock socket. It answers
// CH's "CONNECT <port>" handshake with "OK <n>", then speaks the agent
// protocol (docs/guest-agent.md): hello, ping, and freeze/flush, which
// rewrites sector 0 of every writable disk (a superblock commit, refused
// as CH refuses it on a disk whose raw type was probed rather than given)
// and fsyncs it: the host's proof that the guest's filesystems reached the
// disks. No guest process writes here, so frozen and thawed look alike;
// exec and files are refused.
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
	// CH routes the connection to a guest port first; only the handshake
	// is a text line, read a byte at a time so no frame is consumed.
	line, err := readLine(c)
	if err != nil {
		return
	}
	port, ok := strings.CutPrefix(line, "CONNECT ")
	if _, perr := strconv.ParseUint(port, 10, 32); !ok || perr != nil {
		// CH closes a connection whose first line is not a CONNECT.
		return
	}
	if !a.waitRunning() {
		return
	}
	a.mu.Lock()
	n := a.nextOK
	a.nextOK++
	a.mu.Unlock()
	if _, err := fmt.Fprintf(c, "OK %d\n", n); err != nil {
		return
	}
	hello := false
	for {
		m, err := agentproto.Read(c)
		if errors.Is(err, agentproto.ErrUnknownType) {
			if !a.waitRunning() || agentproto.Write(c, agentproto.Errorf(m.ID, "%v", err)) != nil {
				return
			}
			continue
		}
		if err != nil {
			return
		}
		if !a.waitRunning() {
			return
		}
		reply := a.answer(m, hello)
		if m.Type == agentproto.THello && reply.Type == agentproto.THello {
			hello = true
		}
		if err := agentproto.Write(c, reply); err != nil {
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

func (a *agent) answer(m *agentproto.Message, hello bool) *agentproto.Message {
	if !hello && m.Type != agentproto.THello {
		return agentproto.Errorf(m.ID, "hello first")
	}
	switch m.Type {
	case agentproto.THello:
		return &agentproto.Message{Type: agentproto.THello, ID: m.ID, Version: min(m.Version, agentproto.Version), Agent: "nexus-process-vmm"}
	case agentproto.TPing, agentproto.TThaw:
		return &agentproto.Message{Type: agentproto.TOK, ID: m.ID}
	case agentproto.TFreeze, agentproto.TFlush:
		var paths []string
		for _, d := range a.disks {
			if !d.writable {
				continue
			}
			// The guest's filesystems commit their superblocks, which for
			// an ext4 with 4 KiB blocks rewrites sector 0.
			if err := writeGuestSector0(d); err != nil {
				a.log.Printf("vsock %s: %v", m.Type, err)
				return agentproto.Errorf(m.ID, "%v", err)
			}
			if err := d.f.Sync(); err != nil {
				a.log.Printf("vsock %s: %v", m.Type, err)
				return agentproto.Errorf(m.ID, "%v", err)
			}
			paths = append(paths, d.path)
		}
		return &agentproto.Message{Type: agentproto.TOK, ID: m.ID, Paths: paths}
	}
	return agentproto.Errorf(m.ID, "%s: the process driver's guest runs no programs and holds no files", m.Type)
}
