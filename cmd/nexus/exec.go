package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/nexus-sandbox/nexus/session"
)

func execCmd(g *globals) *cobra.Command {
	var wait *time.Duration
	var stdin, tty bool
	var env []string
	var workdir string
	c := &cobra.Command{
		Use:   "exec ID|HANDLE [flags] -- CMD [ARG...]",
		Short: "Run a command in a running sandbox's guest, through its agent",
		Long: `Run a command in a running sandbox's guest, through its agent, streaming
its stdout and stderr. nexus exits with the command's status: its exit code,
128+n when signal n killed it, 127 when the guest has no such program, 126
when it has but could not run it, and 1 (with a "nexus: ..." line) when
nexus itself failed. Ctrl-C and SIGTERM are forwarded to the guest process;
a second Ctrl-C gives up (the guest process is killed with the session).
With -t the command runs on a terminal in the guest (its stderr arrives on
stdout); with -i -t on a local terminal, keys reach it as typed.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 || len(args) < 2 {
				return usageError{errors.New("want: nexus exec ID -- CMD [ARG...]")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, kv := range env {
				if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
					return usageError{fmt.Errorf("--env %q: want K=V", kv)}
				}
			}
			o := session.ExecOptions{Argv: args[1:], Env: env, Cwd: workdir, Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr(), TTY: tty}
			if stdin {
				o.Stdin = cmd.InOrStdin()
			}
			// -it on a terminal: keys go to the guest's terminal as typed
			// (Ctrl-C included, which the guest's terminal turns into
			// SIGINT), so the local one is raw until the command ends.
			if tty && stdin && term.IsTerminal(int(os.Stdin.Fd())) {
				if old, err := term.MakeRaw(int(os.Stdin.Fd())); err == nil {
					defer term.Restore(int(os.Stdin.Fd()), old)
				}
			}
			// main cancels the command's context on the first signal;
			// here that signal belongs to the guest process, so the
			// session outlives it and a second one ends nexus.
			sigs := make(chan os.Signal, 4)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(sigs)
			fwd := make(chan int, 4)
			go func() {
				for s := range sigs {
					fwd <- int(s.(syscall.Signal))
				}
			}()
			o.Signals = fwd
			ctx := context.WithoutCancel(cmd.Context())
			var st struct{ code, sig int }
			err := withManager(ctx, g, func(m *session.Manager) error {
				m.ReadyTimeout = *wait
				s, err := m.Exec(ctx, args[0], o)
				st.code, st.sig = s.Code, s.Signal
				return err
			})
			var se *session.ExecStartError
			switch {
			case errors.As(err, &se) && se.NotFound:
				fmt.Fprintf(os.Stderr, "nexus: %v\n", err)
				return exitStatus{127}
			case errors.As(err, &se):
				fmt.Fprintf(os.Stderr, "nexus: %v\n", err)
				return exitStatus{126}
			case err != nil:
				return err
			case st.sig != 0:
				return exitStatus{128 + st.sig}
			case st.code != 0:
				return exitStatus{st.code}
			}
			return nil
		},
	}
	c.Flags().BoolVarP(&stdin, "interactive", "i", false, "forward stdin to the command (without it, the command reads nothing)")
	c.Flags().BoolVarP(&tty, "tty", "t", false, "run the command on a terminal in the guest (stderr then arrives on stdout)")
	c.Flags().StringArrayVar(&env, "env", nil, "K=V added to the command's environment (repeatable)")
	c.Flags().StringVarP(&workdir, "workdir", "w", "", "the command's working directory in the guest")
	wait = addExecWait(c)
	return c
}

func cpCmd(g *globals) *cobra.Command {
	var wait *time.Duration
	c := &cobra.Command{
		Use:   "cp ID:PATH LOCAL | LOCAL ID:PATH",
		Short: "Copy one file out of or into a running sandbox's guest",
		Long: `Copy one file out of or into a running sandbox's guest, through its agent.
PATH is absolute in the guest. LOCAL may be "-" (stdout or stdin), and a
LOCAL directory receives the file under its guest name. A file copied in is
in place only once every byte is durable on the guest's disk; a file copied
out is published the same way on the host. Directories are refused.`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			sref, spath, sIn := strings.Cut(src, ":")
			dref, dpath, dIn := strings.Cut(dst, ":")
			if sIn == dIn {
				return usageError{errors.New("want exactly one of the two paths as ID:PATH")}
			}
			ctx := cmd.Context()
			return withManager(ctx, g, func(m *session.Manager) error {
				m.ReadyTimeout = *wait
				if sIn {
					_, err := m.CopyOut(ctx, sref, spath, dst, cmd.OutOrStdout())
					return err
				}
				_, err := m.CopyIn(ctx, dref, src, dpath, cmd.InOrStdin())
				return err
			})
		},
	}
	wait = addExecWait(c)
	return c
}
