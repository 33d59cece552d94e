// Package agent is the guest side of nexus's agent protocol
// (docs/guest-agent.md): sessions on any stream, exec of real processes,
// file reads and writes, and freezing the guest's filesystems with
// FIFREEZE. It runs inside the guest, in cmd/nexus-agent.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
)

// Frozen-state deadlines: what a request without one gets, and the most
// any request gets, so a host that dies cannot leave the guest frozen.
const (
	DefaultFreezeDeadline = 30 * time.Second
	MaxFreezeDeadline     = 10 * time.Minute
)

// Config says what an Agent freezes and how it names itself.
type Config struct {
	// FreezeMounts replaces discovery by disk serial (NexusMounts) with
	// a fixed list of mount points.
	FreezeMounts []string
	Name         string
	Log          *log.Logger
	// Root, when set, is a host directory standing for the guest's root:
	// file paths and exec working directories are taken under it (the
	// process driver's stand-in guest, which runs on the host). Empty in
	// a real guest.
	Root string
	// Freezer, when set, replaces FIFREEZE: the stand-in guest has no
	// filesystems of its own to freeze and syncs its disk images instead.
	Freezer Freezer
}

// Freezer freezes and thaws what a guest's freeze and flush cover.
type Freezer interface {
	Freeze(deadline time.Duration) ([]string, error)
	Thaw() ([]string, error)
}

// Agent serves sessions; its frozen state is shared by all of them.
type Agent struct {
	cfg Config
	z   Freezer
}

// New makes an Agent.
func New(cfg Config) *Agent {
	if cfg.Log == nil {
		cfg.Log = log.New(io.Discard, "", 0)
	}
	if cfg.Name == "" {
		cfg.Name = "nexus-agent"
	}
	mounts := NexusMounts
	if cfg.FreezeMounts != nil {
		fixed := cfg.FreezeMounts
		mounts = func() ([]string, error) { return fixed, nil }
	}
	var z Freezer = &freezer{mounts: mounts}
	if cfg.Freezer != nil {
		z = cfg.Freezer
	}
	return &Agent{cfg: cfg, z: z}
}

// ThawAll thaws whatever is frozen; the agent calls it on its way out.
func (a *Agent) ThawAll() error {
	_, err := a.z.Thaw()
	return err
}

// guestPath is where a guest path is: itself in a guest, under Root on
// the stand-in (Join cleans "..", so a path cannot climb out of Root).
func (a *Agent) guestPath(p string) string {
	if a.cfg.Root == "" {
		return p
	}
	return filepath.Join(a.cfg.Root, filepath.Join("/", p))
}

// session is one stream's state.
type session struct {
	a   *Agent
	rw  io.ReadWriteCloser
	wmu sync.Mutex
	w   *agentproto.FrameWriter // under wmu

	mu     sync.Mutex
	procs  map[uint32]*proc
	writes map[uint32]*upload
	wg     sync.WaitGroup
}

// proc is a running exec. Its stdin is a queue between the session's
// reader and the pipe, so a command slow to read its input delays other
// requests only once the queue (stdinQueue chunks) is full.
type proc struct {
	cmd *exec.Cmd

	mu     sync.Mutex
	stdin  chan []byte // nil: close stdin; nil channel without -i
	closed bool
}

const stdinQueue = 64

// upload is a write in progress: its data frames are written by its own
// goroutine, so a write to a frozen filesystem blocks only itself and the
// session can still be asked to thaw.
type upload struct {
	id   uint32
	f    *os.File
	path string // where the file is written
	name string // the path the host gave, which errors name
	mode os.FileMode
	ch   chan []byte // nil: the last byte arrived; closed: abandoned
}

// Serve runs one session on rw until the stream ends or breaks the
// protocol. On return every process the session started is killed and
// every unfinished write abandoned.
func (a *Agent) Serve(rw io.ReadWriteCloser) error {
	s := &session{a: a, rw: rw, w: agentproto.NewFrameWriter(rw), procs: map[uint32]*proc{}, writes: map[uint32]*upload{}}
	err := s.loop()
	rw.Close()
	s.mu.Lock()
	for _, p := range s.procs {
		// The whole process group: a shell's children die with it.
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	for id, u := range s.writes {
		close(u.ch)
		delete(s.writes, id)
	}
	s.mu.Unlock()
	s.wg.Wait()
	if err == io.EOF {
		return nil
	}
	return err
}

func (s *session) send(m *agentproto.Message) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.w.Write(m)
}

func (s *session) loop() error {
	hello := false
	r := agentproto.NewFrameReader(s.rw)
	for {
		m, err := r.Read()
		if errors.Is(err, agentproto.ErrUnknownType) {
			s.send(agentproto.Errorf(m.ID, "%v", err))
			continue
		}
		if err != nil {
			return err
		}
		if !hello && m.Type != agentproto.THello {
			s.send(agentproto.Errorf(m.ID, "hello first"))
			continue
		}
		switch m.Type {
		case agentproto.THello:
			v := min(m.Version, agentproto.Version)
			s.send(&agentproto.Message{Type: agentproto.THello, ID: m.ID, Version: v, Agent: s.a.cfg.Name})
			hello = true
		case agentproto.TPing:
			s.send(&agentproto.Message{Type: agentproto.TOK, ID: m.ID})
		case agentproto.TFreeze, agentproto.TFlush:
			d := time.Duration(m.DeadlineMs) * time.Millisecond
			if d == 0 {
				d = DefaultFreezeDeadline
			}
			d = min(d, MaxFreezeDeadline)
			paths, err := s.a.z.Freeze(d)
			if err != nil {
				s.a.cfg.Log.Printf("%s: %v", m.Type, err)
				s.send(agentproto.Errorf(m.ID, "%v", err))
				continue
			}
			s.send(&agentproto.Message{Type: agentproto.TOK, ID: m.ID, Paths: paths})
		case agentproto.TThaw:
			paths, err := s.a.z.Thaw()
			if err != nil {
				s.send(agentproto.Errorf(m.ID, "%v", err))
				continue
			}
			s.send(&agentproto.Message{Type: agentproto.TOK, ID: m.ID, Paths: paths})
		case agentproto.TExec:
			s.exec(m)
		case agentproto.TSignal:
			s.mu.Lock()
			p := s.procs[m.Ref]
			s.mu.Unlock()
			if p == nil {
				s.send(agentproto.Errorf(m.ID, "no process for request %d", m.Ref))
				continue
			}
			if err := p.cmd.Process.Signal(syscall.Signal(m.Signal)); err != nil {
				s.send(agentproto.Errorf(m.ID, "signal: %v", err))
				continue
			}
			s.send(&agentproto.Message{Type: agentproto.TOK, ID: m.ID})
		case agentproto.TData:
			s.data(m)
		case agentproto.TRead:
			s.wg.Add(1)
			go func() { defer s.wg.Done(); s.read(m) }()
		case agentproto.TWrite:
			s.startWrite(m)
		default:
			s.send(agentproto.Errorf(m.ID, "%s is not a request", m.Type))
		}
	}
}

func (s *session) exec(m *agentproto.Message) {
	cmd := exec.Command(m.Argv[0], m.Argv[1:]...)
	if len(m.Env) > 0 {
		cmd.Env = m.Env
	}
	if m.Cwd != "" || s.a.cfg.Root != "" {
		cmd.Dir = s.a.guestPath(m.Cwd)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stdout, stderr io.Reader
	var stdin io.WriteCloser
	var pty *os.File // the terminal's master side, when tty
	if m.TTY {
		master, slave, err := openPTY()
		if err != nil {
			s.send(agentproto.Errorf(m.ID, "exec: terminal: %v", err))
			return
		}
		pty = master
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		// A session of its own whose controlling terminal is the pty
		// (its process group is its pid, as with Setpgid).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		defer slave.Close() // the child holds its own copy once started
		stdout = master
		if m.Stdin {
			stdin = nopCloser{master} // end of input is the user's ^D, not a hangup
		}
	} else {
		so, err := cmd.StdoutPipe()
		if err != nil {
			s.send(agentproto.Errorf(m.ID, "exec: %v", err))
			return
		}
		se, err := cmd.StderrPipe()
		if err != nil {
			s.send(agentproto.Errorf(m.ID, "exec: %v", err))
			return
		}
		stdout, stderr = so, se
		if m.Stdin {
			if stdin, err = cmd.StdinPipe(); err != nil {
				s.send(agentproto.Errorf(m.ID, "exec: %v", err))
				return
			}
		}
	}
	startMu.RLock()
	err := cmd.Start()
	if err == nil {
		registerChild(cmd.Process.Pid)
	}
	startMu.RUnlock()
	if err != nil {
		if pty != nil {
			pty.Close()
		}
		s.send(agentproto.Errorf(m.ID, "%s", startError(m.Argv[0], err)))
		return
	}
	p := &proc{cmd: cmd}
	if stdin != nil {
		// A queue between the session's reader and the pipe: a command
		// that does not read its stdin must not stall the session.
		p.stdin = make(chan []byte, stdinQueue)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer stdin.Close()
			for b := range p.stdin {
				if b == nil {
					return
				}
				_, err := stdin.Write(b)
				agentproto.ReleaseData(b)
				if err != nil {
					for range p.stdin {
					}
					return
				}
			}
		}()
	}
	s.mu.Lock()
	s.procs[m.ID] = p
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var out sync.WaitGroup
		out.Add(1)
		go func() { defer out.Done(); s.stream(m.ID, agentproto.TStdout, stdout) }()
		if stderr != nil {
			out.Add(1)
			go func() { defer out.Done(); s.stream(m.ID, agentproto.TStderr, stderr) }()
		}
		// A terminal's master reads EIO once every holder of its slave
		// side is gone, which is how its stream ends.
		out.Wait()
		err := cmd.Wait()
		if pty != nil {
			pty.Close()
		}
		forgetChild(cmd.Process.Pid)
		s.mu.Lock()
		delete(s.procs, m.ID)
		s.mu.Unlock()
		p.mu.Lock()
		if p.stdin != nil {
			close(p.stdin)
		}
		p.closed = true
		p.mu.Unlock()
		exit := &agentproto.Message{Type: agentproto.TExit, ID: m.ID}
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				exit.Signal = int(ws.Signal())
			} else {
				exit.Code = ee.ExitCode()
			}
		default:
			s.send(agentproto.Errorf(m.ID, "exec: wait: %v", err))
			return
		}
		s.send(exit)
	}()
}

func (s *session) stream(id uint32, typ string, r io.Reader) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if s.send(&agentproto.Message{Type: typ, ID: id, Data: buf[:n]}) != nil {
				io.Copy(io.Discard, r) // keep the command from blocking on a full pipe
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *session) data(m *agentproto.Message) {
	s.mu.Lock()
	p := s.procs[m.Ref]
	u := s.writes[m.Ref]
	if u != nil && m.EOF {
		delete(s.writes, m.Ref)
	}
	s.mu.Unlock()
	switch {
	case p != nil:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed || p.stdin == nil {
			return
		}
		if len(m.Data) > 0 {
			p.stdin <- m.Data // the message owns it (agentproto.Read)
		}
		if m.EOF {
			p.stdin <- nil
		}
	case u != nil:
		if len(m.Data) > 0 {
			u.ch <- m.Data
		}
		if m.EOF {
			u.ch <- nil
		}
	}
	// Data for a request that already ended (a command that exited
	// before reading all its input) is dropped.
}

func (s *session) read(m *agentproto.Message) {
	f, err := os.Open(s.a.guestPath(m.Path))
	if err != nil {
		s.send(agentproto.Errorf(m.ID, "%s", fileError(err, m.Path)))
		return
	}
	defer f.Close()
	// Whole frames: fewer frames are fewer writes and wake-ups at both
	// ends.
	buf := make([]byte, agentproto.MaxData)
	var size int64
	for {
		n, err := f.Read(buf)
		if n > 0 {
			size += int64(n)
			if s.send(&agentproto.Message{Type: agentproto.TData, ID: m.ID, Ref: m.ID, Data: buf[:n]}) != nil {
				return
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			s.send(agentproto.Errorf(m.ID, "%s", fileError(err, m.Path)))
			return
		}
	}
	s.send(&agentproto.Message{Type: agentproto.TOK, ID: m.ID, Size: size})
}

func (s *session) startWrite(m *agentproto.Message) {
	mode := os.FileMode(m.Mode)
	if mode == 0 {
		mode = 0o644
	}
	u := &upload{id: m.ID, path: s.a.guestPath(m.Path), name: m.Path, mode: mode, ch: make(chan []byte, stdinQueue)}
	s.mu.Lock()
	s.writes[m.ID] = u
	s.mu.Unlock()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.runWrite(u) }()
}

// runWrite writes an upload's data as it arrives and publishes it at its
// end; an abandoned upload (its session ended) leaves nothing behind.
func (s *session) runWrite(u *upload) {
	var size int64
	// Creating the file happens here, not in the session's reader: on a
	// frozen filesystem it blocks until the thaw.
	dir, base := filepath.Split(u.path)
	if dir == "" {
		dir = "."
	}
	f, werr := os.CreateTemp(dir, "."+base+".nexus-*")
	if werr != nil {
		for b := range u.ch {
			if b == nil {
				s.send(agentproto.Errorf(u.id, "%s", fileError(werr, u.name)))
				return
			}
		}
		return
	}
	u.f = f
	for b := range u.ch {
		if b == nil {
			s.finishWrite(u, size, werr)
			return
		}
		if werr == nil {
			var n int
			n, werr = u.f.Write(b)
			agentproto.ReleaseData(b)
			size += int64(n)
		}
	}
	u.f.Close()
	os.Remove(u.f.Name())
}

// finishWrite publishes an upload as a durable file would be: fsync,
// chmod, rename over the target, fsync the directory.
func (s *session) finishWrite(u *upload, size int64, werr error) {
	fail := func(err error) {
		u.f.Close()
		os.Remove(u.f.Name())
		s.send(agentproto.Errorf(u.id, "%s", fileError(err, u.name)))
	}
	if werr != nil {
		fail(werr)
		return
	}
	if err := u.f.Chmod(u.mode); err != nil {
		fail(err)
		return
	}
	if err := u.f.Sync(); err != nil {
		fail(err)
		return
	}
	if err := u.f.Close(); err != nil {
		fail(err)
		return
	}
	if err := os.Rename(u.f.Name(), u.path); err != nil {
		os.Remove(u.f.Name())
		s.send(agentproto.Errorf(u.id, "%s", fileError(err, u.name)))
		return
	}
	if d, err := os.Open(filepath.Dir(u.path)); err == nil {
		d.Sync()
		d.Close()
	}
	s.send(&agentproto.Message{Type: agentproto.TOK, ID: u.id, Size: size})
}

// ServeListener serves every connection of l in its own session until ctx
// ends or l fails.
func (a *Agent) ServeListener(ctx context.Context, accept func() (io.ReadWriteCloser, error)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Serve(c); err != nil {
				a.cfg.Log.Printf("session: %v", err)
			}
		}()
	}
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// fileError words err for the host about the file at name (the path the
// host gave, which the host's message names): without the paths the agent
// used for it (a temporary file, a stand-in's root), and naming a missing
// directory as such.
func fileError(err error, name string) string {
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	if errors.Is(pe.Err, fs.ErrNotExist) && filepath.Base(pe.Path) != filepath.Base(name) {
		return "no such directory " + filepath.Dir(name)
	}
	return pe.Err.Error()
}

// startError words a command that could not be started: the program as
// the host named it and why, without os/exec's own prefixes.
func startError(argv0 string, err error) string {
	var ee *exec.Error
	if errors.As(err, &ee) {
		return fmt.Sprintf("%q: %v", argv0, ee.Err)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%q: %v", argv0, pe.Err)
	}
	return fmt.Sprintf("%q: %v", argv0, err)
}
