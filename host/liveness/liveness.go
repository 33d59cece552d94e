// Package liveness gathers the reaper's evidence that something still uses
// a resource: intent leases (a non-blocking flock), which ULIDs the
// processes' command lines name (one host/proc scan per run), and
// unix-socket probes. Every inconclusive observation is reported as such,
// never as "dead": the reaper keeps what it cannot rule out.
package liveness

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/fsx"
	hostledger "github.com/nexus-sandbox/nexus/host/ledger"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/ledger"
	"github.com/nexus-sandbox/nexus/reaper"
)

// MaxCmdline is how much of a command line is read; a longer one is
// ambiguous because the ULID might lie past the cutoff.
const MaxCmdline = 512 << 10

// ProbeIntent opens the intent at path, tries a shared non-blocking flock
// (never blocking the creator), and reads what it covers.
func ProbeIntent(path string) reaper.Lease {
	// O_NOFOLLOW: a link is not an intent (and its target is not ours to
	// lock); O_NONBLOCK: a FIFO planted under an intent's name must not hang
	// the reaper on open.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return reaper.Lease{State: reaper.LeaseGone}
	}
	if err != nil {
		return reaper.Lease{State: reaper.LeaseUnreadable, Err: (&os.PathError{Op: "open", Path: path, Err: err}).Error()}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() {
		why := "not a regular file"
		if err != nil {
			why = err.Error()
		}
		return reaper.Lease{State: reaper.LeaseUnreadable, Err: why}
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	var l reaper.Lease
	switch {
	case errors.Is(err, unix.EWOULDBLOCK):
		l.State = reaper.LeaseHeld
	case err != nil:
		return reaper.Lease{State: reaper.LeaseUnreadable, Err: "flock: " + err.Error()}
	default:
		l.State = reaper.LeaseFree
	}
	// The covers matter only while the lease is held; a free lease's
	// creator is gone whatever the file says.
	if l.State == reaper.LeaseHeld {
		var in struct {
			Covers []string `json:"covers"`
		}
		data, err := io.ReadAll(io.LimitReader(f, 1<<20))
		if err == nil && json.Unmarshal(data, &in) == nil {
			l.Covers = in.Covers
		}
	}
	return l
}

// Procs is one scan of /proc/*/cmdline: which ULIDs each process names.
type Procs struct {
	byULID map[string][]int
	// Incomplete lists why the scan cannot rule a ULID out (a truncated,
	// unreadable or vanished command line, a failed readdir).
	Incomplete []string
	// Reads counts the cmdline files read: one per process, per run.
	Reads int
}

// ScanProcs reads every process's command line under procRoot (/proc when
// empty) once, through host/proc's scan, which skips this process (whose
// own arguments may name a sandbox, as `--sandbox ID` does).
func ScanProcs(procRoot string) *Procs {
	p := &Procs{byULID: map[string][]int{}}
	err := proc.ScanCmdlines(procRoot, MaxCmdline, func(c proc.Cmdline) {
		p.Reads++
		switch {
		case c.Err != nil:
			p.Incomplete = append(p.Incomplete, fmt.Sprintf("pid %d: %v", c.Pid, c.Err))
			return
		case c.Truncated:
			p.Incomplete = append(p.Incomplete, fmt.Sprintf("pid %d: command line longer than %d bytes", c.Pid, MaxCmdline))
		}
		for _, id := range ulidTokens(c.Data) {
			p.byULID[id] = append(p.byULID[id], c.Pid)
		}
	})
	if err != nil {
		// A failed listing is named first, as the first reason to doubt.
		p.Incomplete = append([]string{err.Error()}, p.Incomplete...)
	}
	return p
}

// ulidTokens returns every 26-character window of a run of ULID characters
// (Crockford base32, upper case). A run longer than 26 yields every window:
// over-matching only keeps more, which is the safe direction.
func ulidTokens(b []byte) []string {
	var out []string
	start := -1
	flush := func(end int) {
		if start >= 0 && end-start >= 26 {
			for i := start; i+26 <= end; i++ {
				out = append(out, string(b[i:i+26]))
			}
		}
		start = -1
	}
	for i, c := range b {
		if (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') {
			if start < 0 {
				start = i
			}
			continue
		}
		flush(i)
	}
	flush(len(b))
	return out
}

// Process answers the gate's first question for id.
func (p *Procs) Process(id string, ignore []int) reaper.Probe {
	for _, pid := range p.byULID[id] {
		if !contains(ignore, pid) {
			return reaper.Probe{State: reaper.Alive, Detail: fmt.Sprintf("pid %d names %s in its command line", pid, id)}
		}
	}
	if len(p.Incomplete) > 0 {
		more := ""
		if len(p.Incomplete) > 1 {
			more = fmt.Sprintf(" (and %d more)", len(p.Incomplete)-1)
		}
		return reaper.Probe{State: reaper.Unsure, Detail: p.Incomplete[0] + more}
	}
	return reaper.Probe{State: reaper.Dead}
}

func contains(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// ProbeSocket dials a unix socket: an accepted connection is alive;
// refused or absent is dead; a timeout or any other error is unsure.
func ProbeSocket(path string, timeout time.Duration) reaper.Probe {
	c, err := net.DialTimeout("unix", path, timeout)
	if err == nil {
		c.Close()
		return reaper.Probe{State: reaper.Alive, Detail: path + " accepts connections"}
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
		return reaper.Probe{State: reaper.Dead}
	}
	return reaper.Probe{State: reaper.Unsure, Detail: strings.TrimPrefix(err.Error(), "dial unix ")}
}

// Gate is the real liveness gate over one state root.
type Gate struct {
	Root    string
	Procs   *Procs
	Timeout time.Duration

	// listed holds one fresh listing per directory (disks/, run/), taken
	// when first needed, which is after the journal was read. A socket or
	// intent missing from it cannot matter: it did not exist then.
	listed map[string]map[string]bool
}

func (g *Gate) Process(id string, ignore []int) reaper.Probe { return g.Procs.Process(id, ignore) }

// inListing reports whether dir/name existed in dir's fresh listing. A
// listing that fails answers true, so the caller probes for real.
func (g *Gate) inListing(dir, name string) bool {
	if g.listed == nil {
		g.listed = map[string]map[string]bool{}
	}
	set, ok := g.listed[dir]
	if !ok {
		f, err := fsx.OpenDir(g.Root, dir) // a linked dir is not listed
		if err == nil {
			var names []string
			names, err = f.Readdirnames(-1)
			f.Close()
			if err == nil {
				set = make(map[string]bool, len(names))
				for _, n := range names {
					set[n] = true
				}
			}
		}
		if errors.Is(err, os.ErrNotExist) {
			set, err = map[string]bool{}, nil
		}
		g.listed[dir] = set // nil on error: probe everything
	}
	return set == nil || set[name]
}

func (g *Gate) Socket(id string) reaper.Probe {
	sock := layout.Root(g.Root).APISocket(id)
	if !g.inListing("run", filepath.Base(sock)) {
		return reaper.Probe{State: reaper.Dead}
	}
	return ProbeSocket(sock, g.timeout())
}

func (g *Gate) SupervisorSocket(id string) reaper.Probe {
	return ProbeSocket(filepath.Join(g.Root, "supervisors", id, "supervisor.sock"), g.timeout())
}

// Intent probes an intent the first scan did not list: one fresh listing
// of its directory, and a real probe only if it is there now.
func (g *Gate) Intent(rel string) reaper.Lease {
	dir, name := filepath.Split(rel)
	if !g.inListing(filepath.Clean(dir), name) {
		return reaper.Lease{State: reaper.LeaseGone}
	}
	return ProbeIntent(filepath.Join(g.Root, rel))
}

// RunRecord stats runs/<run>.json, the record a client run publishes
// before it spawns its watchdog (host/ledger.Open).
func (g *Gate) RunRecord(run string) reaper.Probe {
	_, err := os.Lstat(filepath.Join(hostledger.Dir(g.Root), run+ledger.RecordSuffix))
	switch {
	case err == nil:
		return reaper.Probe{State: reaper.Alive}
	case errors.Is(err, os.ErrNotExist):
		return reaper.Probe{State: reaper.Dead}
	}
	return reaper.Probe{State: reaper.Unsure, Detail: err.Error()}
}

func (g *Gate) timeout() time.Duration {
	if g.Timeout <= 0 {
		return 250 * time.Millisecond
	}
	return g.Timeout
}
