package proc

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Cmdline is one process's command line as a scan read it.
type Cmdline struct {
	Pid int
	// Data is the command line as the kernel gives it (arguments each
	// ended by a NUL), at most the scan's limit; it is valid only during
	// the visit.
	Data []byte
	// Truncated: the command line is longer than the scan's limit, and
	// Data holds its first limit bytes.
	Truncated bool
	// Err says why it could not be read (the process exited mid-scan, or
	// it is not readable); Data is then what was read before.
	Err error
}

// Args splits Data into arguments.
func (c Cmdline) Args() []string { return splitArgs(c.Data) }

// ScanCmdlines reads the command line of every process listed in procRoot
// (/proc when empty, or a tree shaped like it), once each and at most limit bytes of
// it, and hands each to visit. The calling process is left out: its own
// arguments may name what the caller looks for. An error opening or
// listing procRoot is returned after visiting whatever was listed.
func ScanCmdlines(procRoot string, limit int, visit func(Cmdline)) error {
	if procRoot == "" {
		procRoot = "/proc"
	}
	d, err := os.Open(procRoot)
	if err != nil {
		return fmt.Errorf("open %s: %w", procRoot, err)
	}
	names, listErr := d.Readdirnames(-1)
	d.Close()
	if listErr != nil {
		listErr = fmt.Errorf("readdir %s: %w", procRoot, listErr)
	}
	self := os.Getpid()
	buf := make([]byte, limit+1)
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == self {
			continue
		}
		n, err := readCmdline(filepath.Join(procRoot, name, "cmdline"), buf)
		c := Cmdline{Pid: pid, Data: buf[:min(n, limit)], Truncated: n > limit, Err: err}
		visit(c)
	}
	return listErr
}

func readCmdline(path string, buf []byte) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err == io.EOF {
			break
		}
		if err != nil {
			// ESRCH: the process exited mid-read.
			return n, err
		}
		if m == 0 {
			break
		}
	}
	return n, nil
}

// cmdlineLimit bounds what Matching reads of one command line: far beyond
// any command line nexus gives a process it spawns.
const cmdlineLimit = 512 << 10

// Args reads pid's command line, split into arguments.
func Args(pid int) ([]string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	return splitArgs(data), nil
}

func splitArgs(data []byte) []string {
	if len(data) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
}

// Matching lists the processes whose command line match accepts: how a
// process this code spawned is found before it has said anything about
// itself. Processes that exit or cannot be read mid-scan are left out.
func Matching(match func(argv []string) bool) []int {
	var out []int
	ScanCmdlines("", cmdlineLimit, func(c Cmdline) {
		if c.Err == nil && match(c.Args()) {
			out = append(out, c.Pid)
		}
	})
	return out
}

// HasArgs reports whether argv's arguments (after argv[0]) start with args.
func HasArgs(argv []string, args ...string) bool {
	return len(argv) > len(args) && slices.Equal(argv[1:1+len(args)], args)
}

// WithArgs lists the processes whose command line (after argv[0]) starts
// with args.
func WithArgs(args ...string) []int {
	return Matching(func(argv []string) bool { return HasArgs(argv, args...) })
}
