// Command nexus-agent is the guest half of nexus: it serves the agent
// protocol (docs/guest-agent.md) on vsock, a virtio-serial port, a unix
// socket or an inherited descriptor. Build it static: CGO_ENABLED=0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/guest/agent"
)

// agentPort is the virtio-serial port name the agent serves on when the
// VMM gives it no vsock (docs/guest-agent.md).
const agentPort = "nexus.agent"

func main() {
	if os.Getpid() == 1 {
		pid1()
		return
	}
	fs := flag.NewFlagSet("nexus-agent", flag.ContinueOnError)
	listen := fs.String("listen", "", "serve connections on `unix:PATH`")
	fd := fs.Int("fd", -1, "serve one session on inherited descriptor `N`, then exit")
	vsockPort := fs.Int("vsock-port", 0, "serve connections on vsock `PORT` (1024 for nexus)")
	serial := fs.String("serial", "", "serve sessions one after another on the virtio-serial port `PATH`")
	guest := fs.Bool("guest", false, "serve inside a guest on the virtio-serial port "+agentPort+", else vsock port 1024 (how PID 1 starts the agent beside the image's init)")
	freeze := fs.String("freeze-mounts", "", "comma-separated mount points to freeze instead of the filesystems on disks with a nexus- serial")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	n := 0
	for _, set := range []bool{*listen != "", *fd >= 0, *vsockPort > 0, *serial != "", *guest} {
		if set {
			n++
		}
	}
	if n != 1 || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "nexus-agent: give exactly one of --listen, --fd, --vsock-port, --serial, --guest")
		os.Exit(2)
	}
	logger := log.New(os.Stderr, "nexus-agent: ", log.LstdFlags)
	cfg := agent.Config{Log: logger}
	if *freeze != "" {
		cfg.FreezeMounts = strings.Split(*freeze, ",")
	}
	a := agent.New(cfg)
	if *guest {
		// On the console, where a guest's messages go.
		logger.SetOutput(os.Stdout)
		logger.SetFlags(0)
	}
	if err := run(a, logger, *listen, *fd, *vsockPort, *serial, *guest); err != nil {
		a.ThawAll()
		logger.Print(err)
		os.Exit(1)
	}
	if err := a.ThawAll(); err != nil {
		logger.Print(err)
		os.Exit(1)
	}
}

func run(a *agent.Agent, logger *log.Logger, listen string, fd, vsockPort int, serial string, guest bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// A terminated agent thaws first: nothing else would ever thaw the
	// guest's filesystems before the deadline timer that dies with it.
	go func() {
		<-ctx.Done()
		a.ThawAll()
	}()
	switch {
	case fd >= 0:
		f := os.NewFile(uintptr(fd), "agent-fd")
		if f == nil {
			return fmt.Errorf("descriptor %d is not open", fd)
		}
		done := make(chan error, 1)
		go func() { done <- a.Serve(f) }()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return nil
		}
	case listen != "":
		path, ok := strings.CutPrefix(listen, "unix:")
		if !ok {
			return fmt.Errorf("--listen %q: want unix:PATH", listen)
		}
		os.Remove(path)
		l, err := net.Listen("unix", path)
		if err != nil {
			return err
		}
		context.AfterFunc(ctx, func() { l.Close() })
		return a.ServeListener(ctx, func() (io.ReadWriteCloser, error) { return l.Accept() })
	case guest:
		return serveGuest(ctx, a, logger)
	case vsockPort > 0:
		l, err := listenVsock(uint32(vsockPort))
		if err != nil {
			return fmt.Errorf("vsock port %d: %w", vsockPort, err)
		}
		context.AfterFunc(ctx, func() { l.Close() })
		return a.ServeListener(ctx, func() (io.ReadWriteCloser, error) { return l.accept() })
	default:
		return serveSerial(ctx, a, serial)
	}
}

// serveSerial serves sessions on a virtio-serial port, held open for the
// agent's life (agent.ServeSerial says why and where sessions end).
func serveSerial(ctx context.Context, a *agent.Agent, path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() { f.Close() })
	err = a.ServeSerial(ctx, f, 50*time.Millisecond)
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

type vsockListener struct{ f *os.File }

func listenVsock(port uint32) (*vsockListener, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &vsockListener{f: os.NewFile(uintptr(fd), "vsock")}, nil
}

func (l *vsockListener) accept() (io.ReadWriteCloser, error) {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var nfd int
	var aerr error
	if err := rc.Control(func(fd uintptr) {
		nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC)
	}); err != nil {
		return nil, err
	}
	if aerr != nil {
		return nil, aerr
	}
	return os.NewFile(uintptr(nfd), "vsock-conn"), nil
}

func (l *vsockListener) Close() error { return l.f.Close() }

// defaultPath is PATH for PID 1 and what it runs, as a shell would set it.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// pid1 is the agent as an initramfs's /init: mount what the kernel did
// not, load the modules the initramfs lists, mount the nexus disks found
// by serial, then serve for the guest's whole life. PID 1 must never exit
// (the kernel panics), so a failure says why on the console and powers
// the guest off.
func pid1() {
	logger := log.New(os.Stdout, "nexus-agent: ", 0)
	die := func(err error) {
		logger.Printf("init: %v; powering off", err)
		unix.Sync()
		unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		select {}
	}
	if err := agent.MountPseudo(); err != nil {
		die(err)
	}
	agent.ReapOrphans()
	if err := agent.LoadModules("/etc/nexus/modules"); err != nil {
		die(err)
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		die(err)
	}
	mounts, err := agent.ParseCmdline(string(cmdline), agentproto.SerialWorkspace)
	if err != nil {
		die(err)
	}
	if err := agent.MountDisks(mounts, 30*time.Second); err != nil {
		die(err)
	}
	// The kernel gives PID 1 no PATH; exec's bare names need one.
	if os.Getenv("PATH") == "" {
		os.Setenv("PATH", defaultPath)
	}
	imageInit, err := agent.InitPath(string(cmdline))
	if err != nil {
		die(err)
	}
	// The OS disk, when it holds a filesystem, becomes the agent's root:
	// exec, file paths and the freeze then see the image with /workspace
	// and the volumes in it. Its disk is there by now when attached (the
	// virtio disks probe together), so a short wait suffices; without
	// one, exec runs in the initramfs as before.
	// An overlay root keeps its writes on the workspace disk, beside
	// /workspace: the one disk of the sandbox's own whose fullness start
	// checks, recovers and warns about, and which a flush freezes.
	upperOn := ""
	if agent.RootOverlay(string(cmdline)) {
		upperOn = mounts[agentproto.SerialWorkspace]
	}
	if err := agent.MountOSRoot(agentproto.SerialOS, agent.SysRoot, mounts, upperOn, 2*time.Second); err != nil {
		logger.Printf("init: no OS root, exec runs in the initramfs: %v", err)
		if imageInit != "" {
			logger.Printf("init: %s%s ignored: no OS root to run it in", agent.CmdlineInit, imageInit)
		}
	} else {
		if imageInit != "" {
			handOver(logger, imageInit) // returns only when the agent stays PID 1
		}
		if err := agent.EnterRoot(agent.SysRoot); err != nil {
			die(fmt.Errorf("enter the OS root: %w", err))
		}
		logger.Printf("init: the OS disk is the root exec runs in (%s)", agent.SysRoot)
	}
	die(serveGuest(context.Background(), agent.New(agent.Config{Log: logger}), logger))
}

// handOver gives PID 1 to the image's init (nexus.init=PATH, a path in the
// OS root): a new agent, chrooted into the OS root, serves the host, and
// this process switches root and execs init. It returns only when the
// agent could not be started, and PID 1 stays the serving agent. Once the
// new agent serves, an init that cannot run (checked in the OS root after
// the switch, where its symlinks resolve) leaves PID 1 reaping orphans
// forever: it must not exit, and two agents would share one port.
func handOver(logger *log.Logger, init string) {
	// /proc/self/exe is a magic link, so it reaches this binary, which is
	// in the initramfs, from inside the chroot. Its own session: the
	// image's init manages its process groups, not the agent's.
	child := &exec.Cmd{Path: "/proc/self/exe", Args: []string{"nexus-agent", "--guest"}, Dir: "/",
		Stdout: os.Stdout, Stderr: os.Stdout, SysProcAttr: &syscall.SysProcAttr{Chroot: agent.SysRoot, Setsid: true}}
	if err := child.Start(); err != nil {
		logger.Printf("init: start the agent for %s: %v: the agent stays PID 1", init, err)
		return
	}
	logger.Printf("init: agent is pid %d; handing PID 1 to %s", child.Process.Pid, init)
	err := agent.SwitchRoot(agent.SysRoot, init, os.Environ())
	logger.Printf("init: hand PID 1 to %s: %v; PID 1 only reaps orphans, pid %d serves", init, err, child.Process.Pid)
	select {}
}

// serveGuest serves the host from inside the guest: on the virtio-serial
// port named nexus.agent or, without one, on vsock port 1024. The port may
// appear a moment after boot, so it is waited for, unless the kernel
// command line says the VMM gives none (nexus.agent=vsock: Cloud
// Hypervisor).
func serveGuest(ctx context.Context, a *agent.Agent, logger *log.Logger) error {
	cmdline, _ := os.ReadFile("/proc/cmdline")
	if !agent.VsockOnly(string(cmdline)) {
		if port, err := agent.PortByName(agentPort, time.Now().Add(2*time.Second)); err == nil {
			logger.Printf("serving on virtio-serial port %s", port)
			return serveSerial(ctx, a, port)
		}
	}
	l, err := listenVsock(agentproto.Port)
	if err != nil {
		return fmt.Errorf("no virtio-serial port %s and no vsock: %w", agentPort, err)
	}
	context.AfterFunc(ctx, func() { l.Close() })
	logger.Printf("serving on vsock port %d", agentproto.Port)
	return a.ServeListener(ctx, func() (io.ReadWriteCloser, error) { return l.accept() })
}
