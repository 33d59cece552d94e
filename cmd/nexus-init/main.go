//go:build linux

// Command nexus-init is a minimal /init for a nexus initramfs, until the
// guest agent serves as PID 1: it loads the modules listed in
// /etc/nexus/modules (in order, with finit_module), mounts /dev, /proc and
// /sys, finds the nexus disks by their virtio serial, mounts the workspace
// at /workspace, says "nexus-init: ready" on the console, and stays PID 1,
// counting seconds on the console ("nexus-init: alive N") and answering
// hello and ping on the agent's virtio-serial port. nexus-agent as PID 1 does the
// real work; this init is for tests of the VMM side without the agent.
// Build it static: CGO_ENABLED=0.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/guest/agent"
)

const (
	moduleList      = "/etc/nexus/modules"
	serialWorkspace = "nexus-workspace"
	agentPort       = "nexus.agent"
	// diskWait bounds the wait for virtio-blk to probe the disks after
	// its module loaded; software emulation is slow.
	diskWait = 60 * time.Second
)

func main() {
	if err := setup(); err != nil {
		say("failed: %v", err)
	} else {
		go heartbeat()
		go answerPings(agentPortDevice())
	}
	// PID 1 never exits (the kernel would panic); it reaps orphans.
	for {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(-1, &ws, 0, nil); err != nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// heartbeat counts in memory and says so on the console: a guest restored
// from a snapshot goes on counting where its memory left off, where a
// cold boot would start again at 1.
func heartbeat() {
	for n := 1; ; n++ {
		say("alive %d", n)
		time.Sleep(time.Second)
	}
}

// agentPortDevice waits for the agent's port and returns its device.
// Without udev there is no /dev/virtio-ports/ link: the port is found by
// its name in sysfs, and the link the agent's docs name is made.
func agentPortDevice() string {
	dev, _ := agent.PortByName(agentPort, time.Now().Add(100*365*24*time.Hour))
	os.MkdirAll("/dev/virtio-ports", 0o755)
	os.Symlink("../"+filepath.Base(dev), "/dev/virtio-ports/"+agentPort)
	return dev
}

// answerPings holds the port open (so the host's vsock relay finds a
// listener) and speaks just enough of the agent protocol
// (docs/guest-agent.md) for a host to reach it: hello, ping and the
// relay's reset; anything else is answered "unsupported": this init is
// no agent, and never claims a flush.
func answerPings(dev string) {
	say("agent port %s open", dev)
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		say("agent port %s: %v", dev, err)
		return
	}
	for {
		m, err := agentproto.Read(f)
		switch {
		case err == io.EOF:
			// No host attached: the port reads end-of-file until one is.
			time.Sleep(50 * time.Millisecond)
			continue
		case errors.Is(err, agentproto.ErrUnknownType):
		case err != nil:
			say("agent port: %v", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		var answer *agentproto.Message
		switch m.Type {
		case agentproto.THello:
			answer = &agentproto.Message{Type: agentproto.THello, ID: m.ID, Version: 1, Agent: "nexus-init"}
		case agentproto.TPing:
			answer = &agentproto.Message{Type: agentproto.TOK, ID: m.ID}
		case agentproto.TReset:
			answer = &agentproto.Message{Type: agentproto.TReset, ID: m.ID, Nonce: m.Nonce}
		case agentproto.TData:
			continue
		default:
			answer = agentproto.Errorf(m.ID, "unsupported: nexus-init is no agent")
		}
		agentproto.Write(f, answer)
	}
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stdout, "nexus-init: "+format+"\n", args...)
}

func setup() error {
	// The archive carries no /dev/console node: devtmpfs brings one, and
	// until it is mounted /init has nowhere to write.
	mountErr := unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	if c, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0); err == nil {
		for fd := 0; fd <= 2; fd++ {
			unix.Dup3(c, fd, 0)
		}
		if c > 2 {
			unix.Close(c)
		}
	}
	if mountErr != nil && !errors.Is(mountErr, unix.EBUSY) {
		return fmt.Errorf("mount /dev: %w", mountErr)
	}
	for _, m := range []struct{ src, dir, fs string }{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"tmpfs", "/tmp", "tmpfs"}} {
		os.MkdirAll(m.dir, 0o755)
		if err := unix.Mount(m.src, m.dir, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dir, err)
		}
	}
	if err := agent.LoadModules(moduleList); err != nil {
		return err
	}
	say("modules loaded")
	disks, err := waitDisk(serialWorkspace, diskWait)
	if err != nil {
		return err
	}
	dev := "/dev/" + disks[serialWorkspace]
	os.MkdirAll("/workspace", 0o755)
	if err := unix.Mount(dev, "/workspace", "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount %s (%s) at /workspace: %w", dev, serialWorkspace, err)
	}
	var names []string
	for s, d := range disks {
		names = append(names, s+"="+d)
	}
	say("disks %s", strings.Join(names, " "))
	say("ready")
	return nil
}

// waitDisk maps every disk's serial to its device name once the one
// wanted has appeared: nexus names disks by serial, never by order.
func waitDisk(want string, limit time.Duration) (map[string]string, error) {
	deadline := time.Now().Add(limit)
	for {
		disks := map[string]string{}
		paths, _ := filepath.Glob("/sys/block/*/serial")
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			if s := strings.TrimSpace(string(b)); s != "" {
				disks[s] = filepath.Base(filepath.Dir(p))
			}
		}
		if _, ok := disks[want]; ok {
			return disks, nil
		}
		if time.Now().After(deadline) {
			return disks, fmt.Errorf("no disk with serial %s after %s (found %v)", want, limit, disks)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
