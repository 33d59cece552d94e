package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/oneline"
)

// RunOptions is one `nexus run`: a command whose sandboxes are bound to
// its lifetime.
type RunOptions struct {
	Root   string // the prepared state root
	Driver string // as the caller chose it; "" is the default, not passed on
	Keep   bool   // bind nothing: the command's sandboxes are kept
	Argv   []string
	Nexus  string   // this nexus binary, which the run's client calls
	Env    []string // the environment the command inherits
	// The command's standard streams; Stderr also gets the warning of an
	// init-time sweep that failed.
	Stdin          *os.File
	Stdout, Stderr *os.File
}

// Run runs the command with a client run (unless Keep) whose id it hands
// the command in NEXUS_RUN_ID, forwards SIGINT/SIGTERM (which cancel ctx)
// to it, and afterwards removes every sandbox the command created. It
// returns the command's exit status (128+signal if a signal ended it).
func Run(ctx context.Context, o RunOptions) (int, error) {
	child := exec.Command(o.Argv[0], o.Argv[1:]...)
	// A nil *os.File in an io.Reader/Writer is not nil: leave a stream
	// unset (the null device) rather than hand exec a typed nil.
	if o.Stdin != nil {
		child.Stdin = o.Stdin
	}
	if o.Stdout != nil {
		child.Stdout = o.Stdout
	}
	if o.Stderr != nil {
		child.Stderr = o.Stderr
	}
	env := []string{}
	for _, kv := range o.Env {
		if !strings.HasPrefix(kv, client.EnvRunID+"=") {
			env = append(env, kv)
		}
	}
	// The command's own nexus calls reach the same state root and driver.
	env = append(env, "NEXUS_STATE_DIR="+o.Root)
	if o.Driver != "" {
		env = append(env, "NEXUS_DRIVER="+o.Driver)
	}
	var cl *client.Client
	if !o.Keep {
		name := o.Driver
		if name == "" {
			name = driver.Default
		}
		var err error
		cl, err = client.New(client.Options{Nexus: o.Nexus, StateDir: o.Root, Driver: name})
		if err != nil {
			return 0, err
		}
		if err := cl.Begin(ctx); err != nil {
			return 0, err
		}
		if err := cl.SweepErr(); err != nil && o.Stderr != nil {
			fmt.Fprintf(o.Stderr, "nexus: run: init-time sweep (continuing): %s\n", oneline.Of(err.Error()))
		}
		env = append(env, cl.Env()...)
	}
	child.Env = env
	code, runErr := waitForwarding(ctx, child)
	if cl != nil {
		// The command's sandboxes go with it; the cleanup must finish even
		// when we were asked to stop.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if err := cl.Close(cctx); err != nil {
			return code, errors.Join(runErr, fmt.Errorf("run %s: cleanup: %w", cl.RunID(), err))
		}
	}
	return code, runErr
}

// waitForwarding runs child and passes SIGINT/SIGTERM (which cancel ctx)
// on to it as SIGTERM, then waits for it.
func waitForwarding(ctx context.Context, child *exec.Cmd) (int, error) {
	if err := child.Start(); err != nil {
		return 0, fmt.Errorf("run: %w", err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			child.Process.Signal(syscall.SIGTERM)
		case <-done:
		}
	}()
	err := child.Wait()
	close(done)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return 0, err
}
