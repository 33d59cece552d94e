// Package testutil holds the helpers the end-to-end and process tests
// share: the nexus binary built once, state roots whose processes never
// outlive their test, daemons, children, and poll deadlines that scale with
// the machine's load. Tests only; nothing in nexus imports it.
package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BuildNexus builds the nexus CLI, nexusd, the daemon's binary,
// nexus-fleet, the fleet-wide reads', and nexus-shim, the sandboxes'
// processes' (BuildNexusIn), with the nexustest tag (their failure hooks)
// into a fresh temporary directory, side by side as installed, for a
// TestMain; bin is the CLI. remove deletes the directory.
func BuildNexus() (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "nexus-test-bin-")
	if err != nil {
		return "", nil, err
	}
	if err := BuildNexusIn(dir); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return filepath.Join(dir, "nexus"), func() { os.RemoveAll(dir) }, nil
}

// BuildNexusIn builds nexus, nexusd and nexus-fleet (-tags nexustest,
// and nexusd or nexusfleet for theirs) and nexus-shim into dir, with the
// extra go build flags given.
func BuildNexusIn(dir string, flags ...string) error {
	return buildNexusIn(dir, "nexustest", flags...)
}

// BuildReleaseIn builds nexus, nexusd, nexus-fleet and nexus-shim into
// dir as `make build` does (the CLI and nexus-fleet static), without the
// test hooks, with the extra go build flags given: what a user runs.
func BuildReleaseIn(dir string, flags ...string) error {
	return buildNexusIn(dir, "", flags...)
}

func buildNexusIn(dir, tags string, flags ...string) error {
	withTag := func(t string) string { return strings.Trim(tags+","+t, ",") }
	// The test build keeps cgo: -race needs it.
	cliEnv := []string{"CGO_ENABLED=0"}
	if tags != "" {
		cliEnv = nil
	}
	for _, b := range []struct {
		name, tags, pkg string
		env             []string
	}{{"nexus", tags, "cmd/nexus", cliEnv}, {"nexusd", withTag("nexusd"), "cmd/nexus", nil},
		{"nexus-fleet", withTag("nexusfleet"), "cmd/nexus", cliEnv}, {"nexus-shim", "", "cmd/nexus-shim", nil}} {
		args := append(append([]string{"build"}, flags...), "-tags", b.tags, "-o", filepath.Join(dir, b.name), "github.com/nexus-sandbox/nexus/"+b.pkg)
		build := exec.Command("go", args...)
		build.Env = append(os.Environ(), b.env...)
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", b.name, err, out)
		}
	}
	return nil
}

// Process is a process whose command line names a path below a root.
type Process struct {
	Pid     int
	Cmdline string // arguments joined by spaces
	Zombie  bool
}

// ProcessesUnder scans /proc for processes (other than this one) whose
// command line names a path below root: the VMMs, supervisors and daemons
// of the sandboxes under it.
func ProcessesUnder(root string) []Process {
	return processesNaming(func(arg string) bool { return strings.Contains(arg, root+"/") })
}

// ProcessesOf is ProcessesUnder plus the processes given root itself as
// an argument: a daemon started with `--state-dir root` and the commands
// run on it.
func ProcessesOf(root string) []Process {
	return processesNaming(func(arg string) bool { return arg == root || strings.Contains(arg, root+"/") })
}

// processesNaming scans /proc for processes (other than this one) with an
// argument for which names says true.
func processesNaming(names func(arg string) bool) []Process {
	var out []Process
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !slices.ContainsFunc(strings.Split(string(data), "\x00"), names) {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		i := strings.LastIndexByte(string(stat), ')')
		zombie := i > 0 && i+2 < len(stat) && stat[i+2] == 'Z'
		out = append(out, Process{Pid: pid, Cmdline: strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " ")), Zombie: zombie})
	}
	return out
}

// KillProcessesUnder SIGKILLs every live process under root (the detached
// VMMs and supervisors of sandboxes a test did not remove), so no test's
// processes outlive it, and returns their command lines.
func KillProcessesUnder(root string) []string {
	var killed []string
	for _, p := range ProcessesUnder(root) {
		if !p.Zombie && syscall.Kill(p.Pid, syscall.SIGKILL) == nil {
			killed = append(killed, p.Cmdline)
		}
	}
	return killed
}

// DaemonPids lists the live `nexus daemon` processes serving root (started
// by hand or on demand), by their command line.
func DaemonPids(root string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		i := slices.Index(args, "--state-dir")
		if i < 0 || i+2 >= len(args) || filepath.Clean(args[i+1]) != filepath.Clean(root) || args[i+2] != "daemon" {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if j := bytes.LastIndexByte(stat, ')'); j > 0 && j+2 < len(stat) && stat[j+2] == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// StopDaemons stops every daemon serving root the way a service manager
// would (SIGTERM, then SIGKILL after a generous wait), so no daemon a test
// caused outlives it. It returns their pids.
func StopDaemons(root string) []int {
	pids := DaemonPids(root)
	if len(pids) == 0 {
		return nil // most roots never had a daemon: one scan of /proc, not two
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(time.Minute)
	for len(DaemonPids(root)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for _, pid := range DaemonPids(root) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return pids
}

// StopBinaryDaemons stops the daemons still running from bin (a root no
// cleanup knew of), by pid, for a TestMain's end.
func StopBinaryDaemons(bin string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// A daemon runs nexusd, the binary beside the CLI bin.
		if exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); exe != bin && exe != filepath.Join(filepath.Dir(bin), "nexusd") {
			continue
		}
		data, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if slices.Contains(strings.Split(string(data), "\x00"), "daemon") && syscall.Kill(pid, syscall.SIGKILL) == nil {
			out = append(out, pid)
		}
	}
	return out
}

// ShortRoot is a state root outside t.TempDir(), whose names grow with the
// test's name; short paths keep failure messages readable (deep roots work
// too). When the test ends, the daemon a command started on demand is
// stopped first (a clean stop: it spawned nothing KillProcessesUnder would
// miss), then every process still naming the root is killed, then the root
// is removed.
func ShortRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		StopDaemons(dir)
		if left := KillProcessesUnder(dir); len(left) > 0 && !t.Failed() {
			t.Logf("killed processes the test left running under its state root: %v", left)
		}
		os.RemoveAll(dir)
	})
	return dir
}

// StartDaemon runs `bin --state-dir root daemon` until the test ends
// (stopped as a Proc is), returning once it said it is serving; one that
// does not within Scale(2 min) fails the test with its log.
func StartDaemon(t testing.TB, bin, root string) *Proc {
	t.Helper()
	d := exec.Command(bin, "--state-dir", root, "daemon")
	d.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	p := Start(t, d)
	// The embedded server may warn first (a store rebuilt after a kill).
	p.WaitLog(t, 2*time.Minute, `"serving"`, "msg=serving")
	return p
}

// StartChild starts cmd as our child and, when the test ends, kills and
// reaps it unless the test already did (a second Wait only reports that).
func StartChild(t testing.TB, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// WriteExecutable writes an executable file at path with data, and only
// another process ever holds it open for writing. A file this process
// wrote itself could fail to run with ETXTBSY: a child another test forked
// meanwhile holds the open descriptor until its own exec.
func WriteExecutable(t testing.TB, path string, data []byte) {
	t.Helper()
	src := path + ".src"
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(src)
	if out, err := exec.Command("install", "-m", "0755", src, path).CombinedOutput(); err != nil {
		t.Fatalf("install %s: %v\n%s", path, err, out)
	}
}
