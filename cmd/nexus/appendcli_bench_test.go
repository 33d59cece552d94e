package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/session"
)

// appendingWriters is how many commands, or in-process clients, append at
// once.
const appendingWriters = 8

// BenchmarkAppendingCLI8 is what appending commands reach through the CLI
// against clients of the same daemon in this process, in one run:
//
//	cli:    8 processes at a time of `nexus rename ID NEW` (the release
//	        build, as users run it), each on a sandbox of its own, against
//	        the daemon the first command started on demand; a rename
//	        appends 2 events (sandbox.renamed, handle.claimed) in one request
//	flow:   8 goroutines of this process, each with its own connection to
//	        that daemon kept open, running the same flow (session.Manager's
//	        Rename: the runner lease, the reads, the append, the record)
//	append: 8 goroutines, each its own connection kept open, appending
//	        the same 2 events in one request, nothing else
//
// and, as the floor of any command, 8 at a time of `nexus version`.
//
// Each op runs each side once (renames per writer each), the order
// rotating. It reports each side's events/s, cli/append and cli/flow
// (target: cli ≥ 0.5x the in-process clients), the CPU one rename process
// and one version process cost themselves (medians, wait4), the daemon's
// CPU per event on each side, and the events/s the renames' CPU allows
// with every core free (cli-cpu-bound-events/s).
// NEXUS_BENCH_NEXUS names a release build's directory (nexus, nexusd,
// nexus-shim) to use instead of building one; NEXUS_BENCH_BUILD_FLAGS flags
// for the build.
func BenchmarkAppendingCLI8(b *testing.B) {
	const perWriter = 4
	bin := os.Getenv("NEXUS_BENCH_NEXUS")
	if bin == "" {
		bin = mkdir(b, filepath.Join(b.TempDir(), "release"))
		if err := testutil.BuildReleaseIn(bin, strings.Fields(os.Getenv("NEXUS_BENCH_BUILD_FLAGS"))...); err != nil {
			b.Fatal(err)
		}
	}
	nexus := filepath.Join(bin, "nexus")
	root := shortRoot(b)
	stopDaemonsAtEnd(b, root)
	runNexus(b, root, []string{"NEXUS_NO_AUTO_DAEMON=1"}, "testfill", "--sandboxes", strconv.Itoa(appendingWriters))
	env := append(os.Environ(), "NEXUS_STATE_DIR=")
	// The first command of the release build starts its daemon.
	ls := exec.Command(nexus, "--state-dir", root, "ls", "-q")
	ls.Env = env
	out, err := ls.Output()
	if err != nil {
		b.Fatalf("nexus ls: %v", err)
	}
	ids := strings.Fields(string(out))
	if len(ids) != appendingWriters {
		b.Fatalf("testfill made %d sandboxes, want %d", len(ids), appendingWriters)
	}
	dpid := daemonPid(root)
	if dpid == 0 {
		b.Fatal("no daemon serves the root after the first command")
	}

	ctx := context.Background()
	build, err := managerFor(&globals{stateDir: root})
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(root, wire.SocketName)
	dial := func() *control.Client {
		c, err := control.Dial(ctx, sock)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	handles := make([]string, appendingWriters) // each sandbox's handle now
	var raw []*control.Client
	var managers []*session.Manager
	for w := range appendingWriters {
		raw = append(raw, dial())
		m, err := build(dial())
		if err != nil {
			b.Fatal(err)
		}
		managers = append(managers, m)
		sb, found, err := raw[w].Sandbox(ctx, ids[w])
		if err != nil || !found {
			b.Fatalf("sandbox %s: found %v, %v", ids[w], found, err)
		}
		handles[w] = sb.Handle
	}

	type side struct {
		name    string
		rename  func(w int, handle string) error
		wall    time.Duration
		daemon  time.Duration // the daemon's CPU
		self    time.Duration // this process's CPU
		procCPU []time.Duration
		events  int
	}
	var procMu sync.Mutex
	cli := &side{name: "cli"}
	cli.rename = func(w int, handle string) error {
		cmd := exec.Command(nexus, "--state-dir", root, "rename", ids[w], handle)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nexus rename: %v\n%s", err, out)
		}
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		procMu.Lock()
		cli.procCPU = append(cli.procCPU, time.Duration(ru.Utime.Nano()+ru.Stime.Nano()))
		procMu.Unlock()
		return nil
	}
	flow := &side{name: "flow", rename: func(w int, handle string) error {
		_, err := managers[w].Rename(ctx, ids[w], handle)
		return err
	}}
	appendOnly := &side{name: "append", rename: func(w int, handle string) error {
		at := time.Now().UTC()
		_, err := raw[w].Append(ctx,
			events.New(ulid.Make(), at, ids[w], events.SandboxRenamedEvent{Old: handles[w], Handle: handle}),
			events.New(ulid.Make(), at, ids[w], events.HandleClaimedEvent{Sandbox: ids[w], Handle: handle}))
		return err
	}}
	// The floor of any command: a process of the same binary that talks
	// to no daemon, 8 at a time like the renames.
	version := &side{name: "version"}
	version.rename = func(int, string) error {
		cmd := exec.Command(nexus, "version")
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nexus version: %v\n%s", err, out)
		}
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		procMu.Lock()
		version.procCPU = append(version.procCPU, time.Duration(ru.Utime.Nano()+ru.Stime.Nano()))
		procMu.Unlock()
		return nil
	}
	sides := []*side{cli, flow, appendOnly, version}
	runSide := func(s *side, op int) {
		d0, c0 := processCPU(b, dpid), selfCPU()
		t0 := time.Now()
		var wg sync.WaitGroup
		for w := range appendingWriters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range perWriter {
					h := fmt.Sprintf("%s-%d-%d-%d", s.name, w, op, k)
					if err := s.rename(w, h); err != nil {
						b.Error(err)
						return
					}
					if s != version {
						handles[w] = h
					}
				}
			}()
		}
		wg.Wait()
		s.wall += time.Since(t0)
		s.daemon += processCPU(b, dpid) - d0
		s.self += selfCPU() - c0
		s.events += 2 * appendingWriters * perWriter
	}
	// Once each untimed: the binary in the page cache, every connection warm.
	for _, s := range sides {
		runSide(s, -1)
		s.wall, s.daemon, s.self, s.procCPU, s.events = 0, 0, 0, nil, 0
	}
	b.ResetTimer()
	for op := range b.N {
		for j := range sides {
			runSide(sides[(op+j)%len(sides)], op)
		}
	}
	b.StopTimer()
	if got := daemonPid(root); got != dpid {
		b.Fatalf("the daemon changed during the run (pid %d, then %d)", dpid, got)
	}
	rate := func(s *side) float64 { return float64(s.events) / s.wall.Seconds() }
	for _, s := range sides[:3] {
		b.ReportMetric(rate(s), s.name+"-events/s")
		b.ReportMetric(float64(s.daemon.Microseconds())/float64(s.events), s.name+"-daemon-cpu-us/event")
	}
	b.ReportMetric(rate(cli)/rate(appendOnly), "cli/append")
	b.ReportMetric(rate(cli)/rate(flow), "cli/flow")
	b.ReportMetric(float64(median(cli.procCPU).Microseconds()), "cli-proc-cpu-us")
	b.ReportMetric(float64(median(version.procCPU).Microseconds()), "version-proc-cpu-us")
	// What the renames could reach with every core to themselves: each
	// costs its process's CPU and the daemon's share of it.
	perRename := median(cli.procCPU) + 2*cli.daemon/time.Duration(cli.events)
	b.ReportMetric(2*float64(runtime.NumCPU())/perRename.Seconds(), "cli-cpu-bound-events/s")
	b.ReportMetric(float64(flow.self.Microseconds())/float64(flow.events), "flow-self-cpu-us/event")
	b.ReportMetric(float64(appendOnly.self.Microseconds())/float64(appendOnly.events), "append-self-cpu-us/event")
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("load average %s", strings.Join(strings.Fields(string(load))[:3], " "))
}

// processCPU is pid's user+sys CPU so far (/proc/pid/stat, clock ticks).
func processCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which ends at the last ')'.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
