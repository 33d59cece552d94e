package agent

import (
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// PID 1 inherits every orphan of the guest and must reap it, or each one
// stays a zombie. It must not reap its own exec children, whose statuses
// os/exec collects: those are registered here from before their start
// (startMu held for reading across Start) until their Wait, and the reaper
// (holding startMu for writing) passes over them.
var (
	startMu  sync.RWMutex
	ownMu    sync.Mutex
	ownPids  = map[int]bool{}
	reapOnce sync.Once
)

func registerChild(pid int) {
	ownMu.Lock()
	ownPids[pid] = true
	ownMu.Unlock()
}

func forgetChild(pid int) {
	ownMu.Lock()
	delete(ownPids, pid)
	ownMu.Unlock()
}

// ReapOrphans starts reaping orphaned zombies on every SIGCHLD; PID 1 mode
// calls it once.
func ReapOrphans() {
	reapOnce.Do(func() {
		ch := make(chan os.Signal, 16)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			for range ch {
				reapZombies()
			}
		}()
	})
}

// reapZombies waits for every zombie child of this process that os/exec
// does not own.
func reapZombies() {
	startMu.Lock()
	defer startMu.Unlock()
	me := os.Getpid()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parens.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] != "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if ppid != me || pid == 0 {
			continue
		}
		ownMu.Lock()
		own := ownPids[pid]
		ownMu.Unlock()
		if own {
			continue
		}
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}
