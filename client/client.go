// Package client lets a Go program run nexus sandboxes that are bound to
// its own process: every sandbox it creates is listed in the program's run
// ledger (<state-root>/runs/) before the create starts, an init-time sweep
// reaps the runs of dead processes before the first create, and a watchdog
// process reaps this run within seconds if the program dies by SIGKILL,
// OOM or a crashed CI step.
//
// The client talks to the state root's daemon over its socket, as the
// nexus CLI does, starting one on demand (the nexusd binary) when none
// answers: it runs each command's flow in this process and journals
// through the daemon, so calls from several goroutines run at once and
// work the same with or without a hand-started `nexus daemon`. The nexus
// CLI is run only for what must outlive or precede this process: the
// watchdog, and the sweep of a dead run. docs/api.md describes the API
// and the daemon's socket.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fsx"
	hostledger "github.com/nexus-sandbox/nexus/host/ledger"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/ledger"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/projections"
)

// EnvRunID names the run a `nexus create` or `nexus rm` records its sandbox
// in. The client sets it for the nexus processes it runs; `nexus run` sets
// it for its command.
const EnvRunID = "NEXUS_RUN_ID"

// EnvReaper is the NEXUS_REAPER switch: on (default), sweep, off.
const EnvReaper = "NEXUS_REAPER"

// EnvNexusd names the nexusd binary, as it does for the CLI.
const EnvNexusd = "NEXUS_NEXUSD"

// identify makes this process speak for the build of the first nexusd a
// client names: a daemon of that build is the one its calls use, and one
// of another build started on demand is replaced (control.IdentifyAs,
// which holds for the whole process).
var identify = func() func(string) {
	var once sync.Once
	return func(nexusd string) { once.Do(func() { control.IdentifyAs(nexusd) }) }
}()

// Options configure a Client. Zero values take the environment's choice.
type Options struct {
	Nexus string // path of the nexus CLI; default: "nexus" on PATH
	// Nexusd is the daemon's binary, which also runs each sandbox's
	// processes; default: $NEXUS_NEXUSD, else nexusd beside Nexus (where
	// the CLI finds it). A program uses one nexusd: the first client
	// made names the build every daemon it talks to must run.
	Nexusd   string
	StateDir string      // state root; default: $NEXUS_STATE_DIR, else nexus's own default
	Driver   string      // VMM driver; default: $NEXUS_DRIVER, else the config file's [vm] driver, else cloud-hypervisor
	Reaper   ledger.Mode // default: ParseMode($NEXUS_REAPER)
	RunID    string      // default: a new ULID
}

// CreateSpec is one sandbox to create.
type CreateSpec struct {
	Image     string
	Handle    string
	Workspace string
	Labels    map[string]string
	// Cpus and MemoryBytes size the guest (0: the host's defaults).
	Cpus        int
	MemoryBytes int64
	// Keep leaves the sandbox out of the ledger: it is never reaped, and
	// outlives this process (reuse immunity).
	Keep bool
	// Ready says how a create waits for the guest to be Ready.
	Ready ReadyWait
}

// ReadyWait is how a call that boots a sandbox waits for its guest to be
// Ready (its agent answering), as the CLI's --no-wait and --wait-timeout.
type ReadyWait struct {
	NoWait  bool
	Timeout time.Duration // 0: lifecycle.DefaultReadyTimeout
}

// Client is one run. It is safe for concurrent use.
type Client struct {
	opts Options

	// cmu guards the connection to the state root, made at the first
	// call that needs it.
	cmu  sync.Mutex
	conn control.Backend
	root string // the prepared state root, set with conn
	// cfg is the root's config file as New read it: the defaults of the
	// sandboxes this client makes, as the CLI's.
	cfg config.File

	mu       sync.Mutex
	run      *hostledger.Run
	watchdog *os.File // write end of the watchdog's stdin; only we hold it
	wdPid    int
	sweep    []ledger.Outcome
	sweepErr error
	// kept are the init-time sweep's keep decisions, decided in this
	// process without a journal; the first create journals them, or
	// Begin.
	kept   []events.RunKeptEvent
	closed bool
}

// New makes a client; nothing is written until the first Create.
func New(opts Options) (*Client, error) {
	if opts.Nexus == "" {
		p, err := exec.LookPath("nexus")
		if err != nil {
			return nil, fmt.Errorf("client: nexus binary: %w", err)
		}
		opts.Nexus = p
	}
	abs, err := filepath.Abs(opts.Nexus)
	if err != nil {
		return nil, err
	}
	opts.Nexus = abs
	if opts.Nexusd == "" {
		opts.Nexusd = os.Getenv(EnvNexusd)
	}
	if opts.Nexusd == "" {
		opts.Nexusd = filepath.Join(filepath.Dir(opts.Nexus), "nexusd")
	}
	if opts.Nexusd, err = filepath.Abs(opts.Nexusd); err != nil {
		return nil, err
	}
	if _, err := os.Stat(opts.Nexusd); err != nil {
		return nil, fmt.Errorf("client: nexusd, the daemon's binary (set Options.Nexusd or %s): %w", EnvNexusd, err)
	}
	if opts.StateDir == "" {
		opts.StateDir = os.Getenv("NEXUS_STATE_DIR")
	}
	if opts.StateDir == "" {
		return nil, errors.New("client: no state root (set Options.StateDir or NEXUS_STATE_DIR)")
	}
	if opts.StateDir, err = filepath.Abs(opts.StateDir); err != nil {
		return nil, err
	}
	cfg, _, err := config.Load(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if opts.Driver == "" {
		opts.Driver = cfg.DriverName(os.Getenv("NEXUS_DRIVER"))
	}
	if opts.Reaper == "" {
		opts.Reaper = ledger.ParseMode(os.Getenv(EnvReaper))
	}
	if opts.RunID == "" {
		opts.RunID = ulid.Make().String()
	}
	if !layout.ValidRunID(opts.RunID) {
		return nil, fmt.Errorf("client: run id %q: want letters, digits, '_' and '-'", opts.RunID)
	}
	identify(opts.Nexusd)
	return &Client{opts: opts, cfg: cfg}, nil
}

// RunID is this client's run id.
func (c *Client) RunID() string { return c.opts.RunID }

// WatchdogPid is the watchdog's pid, or 0 if none was spawned (yet).
func (c *Client) WatchdogPid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wdPid
}

// Swept is what the init-time sweep did (nil before it ran, or when off).
func (c *Client) Swept() []ledger.Outcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sweep
}

// SweepErr is why the init-time sweep failed, or nil. A failed sweep does
// not stop the run; what it could not remove waits for the next sweep.
func (c *Client) SweepErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sweepErr
}

// Env is the environment a child process needs to create sandboxes into
// this run (what `nexus run` gives its command).
func (c *Client) Env() []string {
	return []string{EnvRunID + "=" + c.opts.RunID, "NEXUS_STATE_DIR=" + c.opts.StateDir, "NEXUS_DRIVER=" + c.opts.Driver}
}

// Begin opens the run now instead of at the first Create: the init-time
// sweep, the record, the watchdog. Calling it again does nothing. With no
// create to carry them, the sweep's keep decisions are journaled now; a
// failure to do so is reported by SweepErr, and the next Create tries
// again.
func (c *Client) Begin(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.beginLocked(ctx); err != nil {
		return err
	}
	if len(c.kept) == 0 {
		return nil
	}
	b, err := c.backend(ctx)
	if err == nil {
		err = hostledger.JournalKept(ctx, b.Append, c.kept)
	}
	if err != nil {
		c.sweepErr = errors.Join(c.sweepErr, fmt.Errorf("client: journal the sweep's keep decisions: %w", err))
		return nil
	}
	c.kept = nil
	return nil
}

// takeKept hands the pending keep decisions to one create; putBack
// returns them if it failed to journal them (they are journaled at least
// once).
func (c *Client) takeKept() []events.RunKeptEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.kept
	c.kept = nil
	return k
}

func (c *Client) putBack(k []events.RunKeptEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kept == nil {
		c.kept = k
	}
}

func (c *Client) beginLocked(ctx context.Context) error {
	if c.closed {
		return ErrClosed
	}
	if c.run != nil {
		return nil
	}
	dir := hostledger.Dir(c.opts.StateDir)
	// The sweep runs once per process, before our own first create.
	// A sweep that fails (a dead run's sandbox that will not go) must not
	// stop this process from working: its leftovers wait for the next sweep.
	if c.opts.Reaper.Sweeps() {
		var journaled bool
		c.sweep, journaled, c.sweepErr = sweep(ctx, c.opts.Nexus, c.opts.StateDir, c.opts.Driver, c.opts.RunID)
		if c.sweepErr == nil && !journaled {
			c.kept = hostledger.KeptEvents("init", ledger.Self{Run: c.opts.RunID, Driver: c.opts.Driver}, time.Now(), c.sweep)
		}
	}
	rec, err := hostledger.SelfRecord(c.opts.RunID, c.opts.Driver, c.opts.Nexus)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	run, err := hostledger.Open(dir, rec)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if c.opts.Reaper.Watches() {
		if err := c.spawnWatchdog(); err != nil {
			run.Close()
			return err
		}
	}
	c.run = run
	return nil
}

// spawnWatchdog starts `nexus ledger watchdog` detached, its stdin the read
// end of a pipe whose write end stays only here: os.Pipe opens both ends
// O_CLOEXEC, and the child gets the read end as fd 0 alone, so nothing else
// we spawn inherits the write end. When this process dies, for any reason,
// the kernel closes it and the watchdog reads EOF.
func (c *Client) spawnWatchdog() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("client: watchdog pipe: %w", err)
	}
	defer r.Close()
	// logs/ and the log are nexus's own: opened through fsx, so a link
	// planted there is refused rather than followed out of the root.
	if err := os.MkdirAll(c.opts.StateDir, 0o700); err != nil {
		w.Close()
		return err
	}
	if err := fsx.MkdirAll(c.opts.StateDir, "logs", 0o700); err != nil {
		w.Close()
		return err
	}
	logf, err := fsx.OpenFile(c.opts.StateDir, filepath.Join("logs", layout.WatchdogLogName(c.opts.RunID)), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		w.Close()
		return err
	}
	defer logf.Close()
	cmd := exec.Command(c.opts.Nexus, "--state-dir", c.opts.StateDir, "--driver", c.opts.Driver,
		"ledger", "watchdog", "--run", c.opts.RunID)
	cmd.Env = withoutRunEnv(os.Environ())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, logf, logf
	// Its own session: a ^C or hangup aimed at us must not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("client: spawn watchdog: %w", err)
	}
	go cmd.Wait() // reap it if it exits while we live
	c.watchdog, c.wdPid = w, cmd.Process.Pid
	return nil
}

// Sweep is the init-time sweep: it decides on every other run in this
// process (a directory scan, and per run one open that finds the owner's
// liveness lock, or a record and /proc read) and runs `nexus ledger sweep`
// only when some run is to be swept, so the common case opens no journal
// and spawns nothing. Its keep decisions are then not journaled yet: a
// Client journals them with its first create.
func Sweep(ctx context.Context, nexus, stateDir, driver, self string) ([]ledger.Outcome, error) {
	out, _, err := sweep(ctx, nexus, stateDir, driver, self)
	return out, err
}

// sweep is Sweep, also reporting whether the decisions were journaled
// (by the `nexus ledger sweep` it ran).
func sweep(ctx context.Context, nexus, stateDir, driver, self string) ([]ledger.Outcome, bool, error) {
	me := ledger.Self{Run: self, Driver: driver}
	plan, err := hostledger.Plan(hostledger.Dir(stateDir), me, time.Now())
	if err != nil {
		return nil, false, fmt.Errorf("client: sweep: %w", err)
	}
	if !hostledger.AnySweep(plan) {
		return hostledger.Outcomes(plan), false, nil
	}
	args := []string{"ledger", "sweep", "--json"}
	if self != "" {
		args = append(args, "--exclude", self)
	}
	stdout, err := runNexus(ctx, nexus, stateDir, driver, nil, args...)
	if err != nil {
		return nil, false, fmt.Errorf("client: sweep: %w", err)
	}
	var out []ledger.Outcome
	if err := json.Unmarshal(stdout, &out); err != nil {
		return nil, true, fmt.Errorf("client: sweep output: %w", err)
	}
	return out, true, nil
}

// Create creates and boots a sandbox; unless spec.Keep, it is listed in
// this run's ledger before the create starts. Unless spec.Ready.NoWait, it
// then waits for the guest to be Ready: a sandbox that is not Ready in time
// is kept, and returned with the wait's error.
func (c *Client) Create(ctx context.Context, spec CreateSpec) (Sandbox, error) {
	ls := lifecycle.CreateSpec{Image: spec.Image, Handle: spec.Handle, Workspace: spec.Workspace,
		Labels: events.Labels(spec.Labels), Cpus: spec.Cpus, MemoryBytes: spec.MemoryBytes}
	if !spec.Keep {
		c.mu.Lock()
		err := c.beginLocked(ctx)
		c.mu.Unlock()
		if err != nil {
			return Sandbox{}, err
		}
	}
	var sb projections.Sandbox
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		// The init-time sweep ran before this, our first create: its
		// decisions go in first.
		kept := c.takeKept()
		if err := hostledger.JournalKept(ctx, m.B.Append, kept); err != nil {
			c.putBack(kept)
			return err
		}
		var err error
		if ls.Cpus, ls.MemoryBytes, err = m.Sizing(ls.Cpus, ls.MemoryBytes); err != nil {
			return err
		}
		if !spec.Keep {
			// Listed under an id chosen now, the instant before the
			// create starts: a sweep of this run, should we die, finds
			// every sandbox the create may have begun.
			ls.ID = ulid.Make().String()
			if err := c.bind(ls.ID); err != nil {
				return err
			}
		}
		if sb, err = m.Create(ctx, ls); err != nil {
			return err
		}
		sb, err = awaitReady(ctx, m, sb, spec.Ready)
		return err
	})
	if sb.ID == "" {
		return Sandbox{}, wrap("create", spec.Handle, err)
	}
	return sandboxOf(sb), wrap("create", spec.Handle, err)
}

// bind lists id in this run's ledger.
func (c *Client) bind(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.run == nil {
		return ErrClosed
	}
	return c.run.Add(hostledger.Sandboxes, id)
}

// Remove tears a sandbox down, its snapshots with it, and drops it from
// this run's ledger. A sandbox already gone is dropped too, and reported
// as ErrNotFound.
func (c *Client) Remove(ctx context.Context, ref string) error {
	return wrap("remove", ref, c.manage(ctx, func(m *lifecycle.Manager) error { return c.remove(ctx, m, ref) }))
}

func (c *Client) remove(ctx context.Context, m *lifecycle.Manager, ref string) error {
	id := ref
	if sb, err := m.Lookup(ctx, ref); err == nil {
		id = sb.ID
	}
	_, err := m.RemoveWith(ctx, ref, lifecycle.RemoveOptions{Force: true, WithSnapshots: true})
	if err == nil || errors.Is(err, lifecycle.ErrNotFound) {
		c.mu.Lock()
		if c.run != nil {
			err = errors.Join(err, c.run.Drop(hostledger.Sandboxes, id))
		}
		c.mu.Unlock()
	}
	return err
}

// Close is the clean shutdown: every sandbox still listed is removed, the
// ledger files are deleted, the watchdog's pipe is closed (it finds
// nothing left and exits), and the connection to the daemon is closed.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	run := c.run
	c.mu.Unlock()
	if run == nil {
		return c.disconnect()
	}
	var errs []error
	names, _ := run.Names(hostledger.Sandboxes)
	if len(names) > 0 {
		b, err := c.backend(ctx)
		if err == nil {
			err = c.manageOver(b, func(m *lifecycle.Manager) error {
				var errs []error
				for _, n := range names {
					_, err := m.RemoveWith(ctx, n, lifecycle.RemoveOptions{Force: true, WithSnapshots: true})
					if err != nil && !errors.Is(err, lifecycle.ErrNotFound) {
						errs = append(errs, err)
						continue
					}
					errs = append(errs, run.Drop(hostledger.Sandboxes, n))
				}
				return errors.Join(errs...)
			})
		}
		errs = append(errs, err)
	}
	errs = append(errs, c.disconnect())
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		// Leave the ledger: the watchdog, or a later sweep, finishes the job.
		c.closeWatchdog()
		return err
	}
	err := run.Close()
	c.closeWatchdog()
	return err
}

func (c *Client) closeWatchdog() {
	if c.watchdog != nil {
		c.watchdog.Close()
		c.watchdog = nil
	}
}

// Error is a failed nexus CLI process (the sweep of a dead run): its exit
// code and its one-line error.
type Error struct {
	Args []string
	Code int
	Msg  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("nexus %s: exit %d: %s", strings.Join(e.Args, " "), e.Code, e.Msg)
}

func withoutRunEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, EnvRunID+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// runNexus runs one nexus command; extra env entries are added to ours
// without NEXUS_RUN_ID, so only the ones we pass bind a sandbox to a run.
func runNexus(ctx context.Context, nexus, stateDir, driver string, env []string, args ...string) ([]byte, error) {
	full := append([]string{"--state-dir", stateDir, "--driver", driver}, args...)
	cmd := exec.CommandContext(ctx, nexus, full...)
	cmd.Env = append(withoutRunEnv(os.Environ()), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		msg := strings.TrimSpace(errb.String())
		msg = strings.TrimPrefix(msg, "nexus: ")
		return nil, &Error{Args: args, Code: ee.ExitCode(), Msg: msg}
	}
	if err != nil {
		return nil, fmt.Errorf("nexus %s: %w", strings.Join(args, " "), err)
	}
	return out.Bytes(), nil
}
