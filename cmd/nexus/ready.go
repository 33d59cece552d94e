package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/session"
)

// readyWait is how create, start, fork and restore wait for Ready:
// --no-wait returns at boot, --wait-timeout bounds the wait.
type readyWait struct {
	noWait  bool
	timeout time.Duration
}

func addReadyFlags(c *cobra.Command) *readyWait {
	w := &readyWait{}
	c.Flags().BoolVar(&w.noWait, "no-wait", false, "return once the VMM boots, without waiting for the guest to be Ready")
	c.Flags().DurationVar(&w.timeout, "wait-timeout", session.DefaultReadyTimeout, "how long to wait for the guest to be Ready (its agent answering); past it the sandbox is left running, Ready=False reason=AgentNotReady, and the command fails")
	return w
}

// await waits for a sandbox a command booted to be Ready and returns it
// as it now stands, with the wait's error (the sandbox is kept either
// way). A sandbox that is not running (a fork of a stopped parent) is
// not waited for.
func (w *readyWait) await(ctx context.Context, m *session.Manager, sb projections.Sandbox) (projections.Sandbox, error) {
	if w.noWait || sb.State != projections.StateRunning {
		return sb, nil
	}
	ready, err := m.WaitReady(ctx, sb.ID, w.timeout, true)
	if err == nil {
		return ready, nil
	}
	if now, ferr := m.Find(context.WithoutCancel(ctx), sb.ID); ferr == nil {
		sb = now
	}
	if ctx.Err() != nil {
		// The command did what it was asked; only the wait was cut short.
		err = fmt.Errorf("sandbox %s is %s; interrupted while waiting for its guest to be Ready (`nexus wait %s --for ready` waits again): %w",
			sb.ID, sb.State, sb.ID, context.Cause(ctx))
	}
	return sb, err
}

// addExecWait is exec's and cp's bound on waiting for a booting sandbox.
func addExecWait(c *cobra.Command) *time.Duration {
	var d time.Duration
	c.Flags().DurationVar(&d, "wait-timeout", session.DefaultReadyTimeout, "how long to wait for a sandbox that is not Ready yet (booting) before failing")
	return &d
}

func waitCmd(g *globals) *cobra.Command {
	var cond string
	var timeout time.Duration
	var o *output
	c := &cobra.Command{
		Use:   "wait ID...",
		Short: "Wait for sandboxes to be Ready, stopped or exited",
		Long: `Wait for each sandbox in turn to reach --for:
  ready    its guest is Ready (its agent answers; a guest booted without the
           agent: its VMM runs), journaled as sandbox.ready the first time
  stopped  no VMM runs (stopped, exited or in error)
  exited   its VMM ended without a stop
Fails (exit 1) when one does not within --timeout.`,
		Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch cond {
			case client.ForReady, client.ForStopped, client.ForExited:
			default:
				return usageError{fmt.Errorf("--for %q: want ready, stopped or exited", cond)}
			}
			if timeout <= 0 {
				return usageError{fmt.Errorf("--timeout %s: want a positive duration", timeout)}
			}
			return withManager(cmd.Context(), g, func(m *session.Manager) error {
				var done []projections.Sandbox
				err := eachRef(cmd, args, func(ref string) error {
					sb, err := m.WaitFor(cmd.Context(), ref, cond, timeout)
					if err == nil {
						done = append(done, sb)
						if o.human() {
							sandboxLine(cmd, sb)
						}
					}
					return err
				})
				return errors.Join(err, printEach(cmd, o, args, sandboxesJSON(done), sandboxID))
			})
		},
	}
	c.Flags().StringVar(&cond, "for", client.ForReady, "ready, stopped or exited")
	c.Flags().DurationVar(&timeout, "timeout", session.DefaultReadyTimeout, "how long to wait for each sandbox")
	o = addOutput(c, true)
	return c
}
