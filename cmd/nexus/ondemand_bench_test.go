package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkScaleOnDemand is the scale table as users pay it: the CLI
// reaching a daemon it starts on demand, on roots that `nexus testfill`
// built (stopped sandboxes with their small sparse files, every tenth with
// a snapshot, every 25th with a volume). NEXUS_BENCH_SIZES lists the roots'
// sizes ("1,1000,10000" unless set), NEXUS_BENCH_ROUNDS the rounds (3).
// Each round stops the daemon, then times on that root: the first command
// (inspect, which starts the daemon), every single-sandbox command on a
// sandbox of its own (create, inspect, stop, start, snapshot, restore, rm
// -f), recover, reap (dry run), `ls --json --limit 100`, `ls --json` of
// every sandbox against `cat` of its output, `events --tail 10`, each
// against `nexus version` in the same round, and counts the files under
// leases/ after each command. It prints medians, the daemon's max RSS and
// each command's growth from the second size to each larger one.
func BenchmarkScaleOnDemand(b *testing.B) {
	sizes := []int{1, 1000, 10000}
	if s := os.Getenv("NEXUS_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				b.Fatalf("NEXUS_BENCH_SIZES %q: %q is not a count", s, f)
			}
			sizes = append(sizes, n)
		}
	}
	rounds := scaleRounds(3)
	img := makeImage(b)
	noDaemon := []string{"NEXUS_NO_AUTO_DAEMON=1"}
	roots := make([]string, len(sizes))
	var lastWrite time.Time
	for i, n := range sizes {
		roots[i] = shortRoot(b)
		t0 := time.Now()
		runNexus(b, roots[i], noDaemon, "testfill", "--sandboxes", strconv.Itoa(n))
		lastWrite = time.Now()
		b.Logf("testfill of %d sandboxes: %v", n, lastWrite.Sub(t0).Round(time.Millisecond))
	}
	if wait := time.Until(lastWrite.Add(dedupeWindow + 5*time.Second)); wait > 0 && os.Getenv("NEXUS_BENCH_FRESH") != "1" {
		b.Logf("waiting %v for the de-duplication window to pass", wait.Round(time.Second))
		time.Sleep(wait)
	}
	type cell struct {
		op, base []sample
		leases   int
	}
	cells := make([]map[string]*cell, len(sizes))
	rss := make([]int64, len(sizes))
	var ops []string
	for i, root := range roots {
		cells[i] = map[string]*cell{}
		scratch := b.TempDir()
		for r := range rounds {
			record := func(op string, s, base sample) {
				if r == 0 && i == 0 {
					ops = append(ops, op)
				}
				c := cells[i][op]
				if c == nil {
					c = &cell{}
					cells[i][op] = c
				}
				c.op, c.base = append(c.op, s), append(c.base, base)
				c.leases = max(c.leases, countFiles(filepath.Join(root, "leases")))
				rss[i] = max(rss[i], daemonHWM(root))
			}
			version := func() sample {
				s, _ := runNexus(b, root, nil, "version")
				return s
			}
			run := func(op string, args ...string) string {
				s, out := runNexus(b, root, nil, args...)
				record(op, s, version())
				return strings.TrimSpace(string(out))
			}
			handle := fmt.Sprintf("bench-%d", r)
			// The daemon starts on demand: a command on a root without one.
			stopDaemonOf(root)
			s, _ := runNexus(b, root, nil, "events", "--tail", "1")
			record("first command (daemon start)", s, version())
			id := run("create", "--driver", "process", "create", "--image", img, "--handle", handle, "-q")
			run("inspect ID", "inspect", id)
			run("stop", "--driver", "process", "stop", id)
			run("start", "--driver", "process", "start", id)
			snap := run("snapshot", "--driver", "process", "snapshot", id)
			child := run("restore", "--driver", "process", "restore", snap, "-q")
			run("recover", "--driver", "process", "recover")
			run("reap (dry run)", "--driver", "process", "reap")
			run("ls --json --limit 100", "ls", "--json", "--limit", "100")
			s, out := runNexus(b, root, nil, "ls", "--json")
			p := filepath.Join(scratch, "ls.json")
			if err := os.WriteFile(p, out, 0o644); err != nil {
				b.Fatal(err)
			}
			c, got := runSample(b, nil, "cat", p)
			if len(got) != len(out) {
				b.Fatalf("cat printed %d bytes of %d", len(got), len(out))
			}
			record("ls --json (all), against cat", s, c)
			run("events --tail 10", "events", "--tail", "10")
			run("rm -f", "--driver", "process", "rm", "-f", "--with-snapshots", id, child)
		}
		stopDaemonOf(root)
		killProcessesUnder(root)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	printOnDemand(os.Stdout, sizes, ops, func(i int, op string) ([]sample, []sample, int) {
		c := cells[i][op]
		return c.op, c.base, c.leases
	}, rss, rounds, strings.Join(strings.Fields(string(load))[:3], " "))
	if len(sizes) > 2 {
		from := 1
		for to := 2; to < len(sizes); to++ {
			for _, op := range ops {
				g := medianOf(cells[to][op].op).d.Seconds() / medianOf(cells[from][op].op).d.Seconds()
				b.ReportMetric(g, strings.NewReplacer(" ", "_", ",", "").Replace(fmt.Sprintf("%s/growth-%d→%d", op, sizes[from], sizes[to])))
			}
		}
	}
}

func printOnDemand(w io.Writer, sizes []int, ops []string, cell func(i int, op string) (samples, base []sample, leases int), rss []int64, rounds int, load string) {
	fmt.Fprintf(w, "\nOn-demand daemon: median of %d rounds, ms (x its baseline in the same rounds: `nexus version`, or cat for ls --json); leases/ files after the command; load average %s\n\n| command |", rounds, load)
	for _, n := range sizes {
		fmt.Fprintf(w, " %d |", n)
	}
	var growths []string
	for to := 2; to < len(sizes); to++ {
		growths = append(growths, fmt.Sprintf("%d→%d", sizes[1], sizes[to]))
	}
	for _, g := range growths {
		fmt.Fprintf(w, " growth %s |", g)
	}
	fmt.Fprintf(w, "\n|---|%s%s\n", strings.Repeat("---|", len(sizes)), strings.Repeat("---|", len(growths)))
	for _, op := range ops {
		fmt.Fprintf(w, "| %s |", op)
		med := make([]sample, len(sizes))
		for i := range sizes {
			o, base, leases := cell(i, op)
			med[i] = medianOf(o)
			fmt.Fprintf(w, " %.0f (%.1fx) %d |", ms(med[i].d), med[i].d.Seconds()/medianOf(base).d.Seconds(), leases)
		}
		for to := 2; to < len(sizes); to++ {
			fmt.Fprintf(w, " %.2fx |", med[to].d.Seconds()/med[1].d.Seconds())
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "| daemon max RSS (VmHWM) |")
	for i := range sizes {
		fmt.Fprintf(w, " %.0f MB |", float64(rss[i])/1024)
	}
	for to := 2; to < len(sizes); to++ {
		fmt.Fprintf(w, " %.2fx |", float64(rss[to])/float64(rss[1]))
	}
	fmt.Fprintln(w)
}

// stopDaemonOf asks the daemon of root, if one runs, to stop.
func stopDaemonOf(root string) {
	cmd := exec.Command(nexusBin, "--state-dir", root, "daemon", "stop")
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	cmd.Run()
}

// countFiles is the number of regular files under dir (0 if none).
func countFiles(dir string) int {
	n := 0
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return nil
	})
	return n
}

// daemonPid is the pid of the daemon serving root, 0 if none runs: the
// process whose arguments are --state-dir root and daemon.
func daemonPid(root string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
		if i := slices.Index(args, "--state-dir"); i >= 0 && i+1 < len(args) && args[i+1] == root && slices.Contains(args, "daemon") {
			return pid
		}
	}
	return 0
}

// daemonHWM is the max RSS (VmHWM, kB) of the daemon serving root, 0 if
// none runs.
func daemonHWM(root string) int64 {
	pid := daemonPid(root)
	if pid == 0 {
		return 0
	}
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}
