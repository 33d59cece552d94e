package standin

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	guestagent "github.com/nexus-sandbox/nexus/guest/agent"
	"github.com/nexus-sandbox/nexus/host/unixsock"
	"github.com/nexus-sandbox/nexus/host/vmm"
)

// agent stands in for the guest agent behind CH's vsock socket. It answers
// CH's "CONNECT <port>" handshake with "OK <n>", then serves the agent
// protocol (docs/guest-agent.md) with the guest's own implementation
// (guest/agent) on the host: exec runs real processes, read and write
// real files, in a directory standing for the guest's root (root, made at
// boot and removed with the VM, or by the next VMM to start if this one
// was killed: the stand-in guest has no disk to keep them on). freeze and flush rewrite sector 0 of every writable disk (a
// superblock commit, refused as CH refuses it on a disk whose raw type was
// probed rather than given) and fsync it: the host's proof that the
// guest's filesystems reached the disks. Nothing stops the host processes
// exec started from writing while "frozen": the stand-in's disks are not
// their filesystem.
//
// While the VM is paused the agent reads but does not answer, as a frozen
// guest cannot: a host that asks the guest to flush after pausing it hangs
// here as it would on CH, instead of passing.
type agent struct {
	l     *unixsock.Listener
	disks []disk
	log   *logger
	guest *guestagent.Agent
	root  string
	// console writes a line to the guest's serial console (nil: none).
	console func(format string, args ...any)
	done    chan struct{}
	wg      sync.WaitGroup

	mu      sync.Mutex
	resumed chan struct{} // nil while running; closed on resume
	conns   map[net.Conn]struct{}
	nextOK  int
}

func startAgent(path string, disks []disk, paused bool, log *logger, console func(string, ...any)) (*agent, error) {
	l, err := unixsock.Listen(path)
	if err != nil {
		return nil, err
	}
	sweepGuestRoots()
	root, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", guestRootPrefix, os.Getpid()))
	if err != nil {
		l.Close()
		return nil, err
	}
	// The guest's usual mount points, so guest paths such as
	// /workspace/f name something.
	for _, d := range []string{"workspace", "tmp"} {
		os.Mkdir(filepath.Join(root, d), 0o755)
	}
	a := &agent{l: l, disks: disks, log: log, root: root, console: console, done: make(chan struct{}), conns: map[net.Conn]struct{}{}, nextOK: 1 << 30}
	a.guest = guestagent.New(guestagent.Config{Root: root, Freezer: diskFreezer{a}, Name: "nexus-process-vmm"})
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
	// Every session has ended, and with it every process it started.
	os.RemoveAll(a.root)
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
	line, err := vmm.ReadHandshakeLine(c)
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
	a.guest.Serve(pausable{c, a})
}

// pausable holds the session's frames while the VM is paused: a frame
// read is not handed on, and an answer not written, until it resumes.
type pausable struct {
	net.Conn
	a *agent
}

func (p pausable) Read(b []byte) (int, error) {
	if !p.a.waitRunning() {
		return 0, io.EOF
	}
	n, err := p.Conn.Read(b)
	if !p.a.waitRunning() {
		return 0, io.EOF
	}
	return n, err
}

func (p pausable) Write(b []byte) (int, error) {
	if !p.a.waitRunning() {
		return 0, net.ErrClosed
	}
	return p.Conn.Write(b)
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

// guestRootPrefix names the stand-in guests' roots in $TMPDIR, followed by
// the pid of the VMM that made one.
const guestRootPrefix = "nexus-guest-root-"

// sweepGuestRoots removes the guest roots of VMMs that are gone (killed
// before they could remove their own). A root whose pid runs, or whose
// name does not parse, is left alone.
func sweepGuestRoots() {
	tmp := os.TempDir()
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), guestRootPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || err == syscall.EPERM {
			continue
		}
		os.RemoveAll(filepath.Join(tmp, e.Name()))
	}
}

// diskFreezer is the stand-in's freeze: the guest's filesystems commit
// their superblocks, which for an ext4 with 4 KiB blocks rewrites sector
// 0, and the disks are fsynced. Thaw has nothing to undo.
type diskFreezer struct{ a *agent }

func (z diskFreezer) Freeze(time.Duration) ([]string, error) {
	var paths []string
	for _, d := range z.a.disks {
		if !d.writable {
			continue
		}
		if err := writeGuestSector0(d); err != nil {
			z.a.log.Printf("vsock freeze: %v", err)
			return nil, err
		}
		if err := d.f.Sync(); err != nil {
			z.a.log.Printf("vsock freeze: %v", err)
			return nil, err
		}
		paths = append(paths, d.path)
	}
	z.say("froze %d disk(s)", len(paths))
	return paths, nil
}

// Thaw has nothing to undo but says so on the console, as a guest kernel
// logs its thaws, so a test can see when the host thawed.
func (z diskFreezer) Thaw() ([]string, error) {
	z.say("thawed")
	return nil, nil
}

func (z diskFreezer) say(format string, args ...any) {
	if z.a.console != nil {
		z.a.console(format, args...)
	}
}
