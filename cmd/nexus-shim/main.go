// Command nexus-shim runs a sandbox's own host processes: its perimeter
// supervisor and the process and qemu drivers' VMMs. nexus spawns it
// detached, once per process, with the command lines host/supervisor and
// host/driver build (`nexus-shim supervisor --sandbox ID ...`, `nexus-shim
// vmm-process --api-socket PATH`); each says when it serves on the
// readiness pipe it inherits (proc.ReadyHook). It links only what those
// processes run, not the CLI or the daemon's store and nats-server, so a
// spawn costs the start of a small program. nexusd serves the same
// command lines, for processes started by hand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/qemu"
	"github.com/nexus-sandbox/nexus/host/supervisor"
	"github.com/nexus-sandbox/nexus/host/vmm/standin"
)

// errUsage marks a command line the shim cannot run: exit 2.
var errUsage = errors.New("usage")

func main() {
	ready := proc.ReadyHook()
	// The first SIGTERM or SIGINT ends the process's serving in order (its
	// VM released, its sockets removed); a second one ends it at once.
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
		<-sigs
		os.Exit(130)
	}()
	err := run(ctx, os.Args[1:], ready, os.Stderr)
	if err == nil {
		os.Exit(0)
	}
	fmt.Fprintf(os.Stderr, "nexus-shim: %v\n", err)
	if errors.Is(err, errUsage) {
		os.Exit(2)
	}
	os.Exit(1)
}

// run runs the role args names with its flags.
func run(ctx context.Context, args []string, ready func(), log io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: nexus-shim %s|%s|%s FLAGS", errUsage, supervisor.Command, driver.ProcessCommand, driver.QEMUCommand)
	}
	role, args := args[0], args[1:]
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	fs.SetOutput(log)
	parse := func(required ...string) error {
		if err := fs.Parse(args); err != nil {
			return fmt.Errorf("%w: %s: %v", errUsage, role, err)
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("%w: %s takes no arguments, got %q", errUsage, role, fs.Args())
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for _, name := range required {
			if !set[name] {
				return fmt.Errorf("%w: %s: required flag --%s not set", errUsage, role, name)
			}
		}
		return nil
	}
	switch role {
	case supervisor.Command:
		o := supervisor.ServeOptions{Now: time.Now, Log: log, Ready: ready}
		fs.StringVar(&o.SandboxID, supervisor.SandboxFlag, "", "sandbox ULID")
		fs.StringVar(&o.StateDir, supervisor.StateDirFlag, "", "supervisors/<ULID> directory")
		fs.StringVar(&o.IIDSocket, supervisor.IIDSocketFlag, "", "instance-identity socket path")
		fs.StringVar(&o.ConsoleLog, supervisor.ConsoleLogFlag, "", "console log whose time index to keep")
		fs.StringVar(&o.ConsoleIndex, supervisor.ConsoleIndexFlag, "", "the console log's time index")
		if err := parse(supervisor.SandboxFlag, supervisor.StateDirFlag, supervisor.IIDSocketFlag); err != nil {
			return err
		}
		return supervisor.Serve(ctx, o)
	case driver.ProcessCommand:
		api := fs.String(driver.APISocketFlag, "", "API socket path")
		if err := parse(driver.APISocketFlag); err != nil {
			return err
		}
		return standin.Serve(ctx, *api, log, ready)
	case driver.QEMUCommand:
		o := qemu.Options{Log: log, Ready: ready}
		api := fs.String(driver.APISocketFlag, "", "API socket path")
		fs.StringVar(&o.Binary, driver.QEMUBinaryFlag, driver.DefaultQEMUBinary, "QEMU binary")
		fs.StringVar(&o.Accel, "accel", os.Getenv("NEXUS_QEMU_ACCEL"), "kvm or tcg")
		if err := parse(driver.APISocketFlag); err != nil {
			return err
		}
		if o.Accel != "" && o.Accel != "kvm" && o.Accel != "tcg" {
			return fmt.Errorf("%w: --accel %q: want kvm or tcg", errUsage, o.Accel)
		}
		return qemu.Serve(ctx, *api, o)
	}
	return fmt.Errorf("%w: unknown role %q: want %s, %s or %s", errUsage, role, supervisor.Command, driver.ProcessCommand, driver.QEMUCommand)
}
