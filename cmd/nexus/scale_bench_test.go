package main

// The scale table: the real binary's commands at 0, 1k, 10k and
// 100k sandboxes and on 10 sandboxes with 1M events, with and without a
// daemon, each against a baseline measured in the same round
// (docs/benchmarks.md, "Scale table"):
//
//	BenchmarkScaleTable     ms and max RSS per command per size, growth 1k→100k and 1k→1M events
//	BenchmarkScaleCreates8  8 clients creating through one daemon vs 1 client
//
// Run with -benchtime 1x: each benchmark runs its own rounds
// (NEXUS_BENCH_ROUNDS), because a second invocation by the
// testing package would build every fixture again.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/journalfixture"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// scaleRounds is how many rounds a benchmark runs: NEXUS_BENCH_ROUNDS, or
// def.
func scaleRounds(def int) int {
	if n, err := strconv.Atoi(os.Getenv("NEXUS_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return def
}

// sample is one process's wall time and its max RSS.
type sample struct {
	d     time.Duration
	rssKB int64
}

// timeBin is GNU time, which reports its child's max RSS. The benchmark
// cannot take it from its own wait4: Go starts a child with vfork, so the
// child's exec records this process's high-water RSS (the fixtures built
// in it) as the child's own, and every command would read as large as the
// benchmark. time forks from its own small address space instead.
const timeBin = "/usr/bin/time"

// runSample runs name with args to completion under GNU time, returning
// its wall time (time's own start included, in the baseline too), the
// command's max RSS and its stdout; a failure fails the benchmark, as a
// table built on refused commands would measure refusals.
func runSample(b *testing.B, env []string, name string, args ...string) (sample, []byte) {
	b.Helper()
	rss, err := os.CreateTemp("", "nexus-rss-")
	if err != nil {
		b.Fatal(err)
	}
	rss.Close()
	defer os.Remove(rss.Name())
	cmd := exec.Command(timeBin, append([]string{"-f", "%M", "-o", rss.Name(), name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	err = cmd.Run()
	d := time.Since(t0)
	if err != nil {
		b.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, errb.String())
	}
	raw, err := os.ReadFile(rss.Name())
	if err != nil {
		b.Fatal(err)
	}
	kb, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		b.Fatalf("%s reported max RSS %q: %v", timeBin, raw, err)
	}
	return sample{d, kb}, out.Bytes()
}

// runNexus runs the test binary on root; env adds to the environment (the
// no-daemon mode sets NEXUS_NO_AUTO_DAEMON=1 there).
func runNexus(b *testing.B, root string, env []string, args ...string) (sample, []byte) {
	b.Helper()
	return runSample(b, append([]string{"NEXUS_STATE_DIR="}, env...), nexusBin, append([]string{"--state-dir", root}, args...)...)
}

// scaleHistoryName names the fixture of 10 sandboxes and 1M events.
const scaleHistoryName = "10 sb, 1M ev"

// scaleFixture is a state root built once, copied for each mode.
type scaleFixture struct {
	name string
	dir  string
}

// scaleCell is one command's samples at one fixture in one mode, with the
// baseline measured in the same rounds.
type scaleCell struct {
	op, base []sample
}

// The commands of the table, in the order each round runs them.
var scaleOps = []string{"create", "inspect ID", "stop", "start", "ls --json --limit 100", "ls --json", "events --tail 10", "volume create (1 event)", "rm -f"}

// scaleOpBaseline names each command's baseline.
var scaleOpBaseline = map[string]string{
	"ls --json --limit 100":   "cat of the same bytes",
	"ls --json":               "cat of the same bytes",
	"volume create (1 event)": "`nexus version` + mkfs.ext4 of 8 MiB",
}

// BenchmarkScaleTable runs each command of scaleOps on copies of roots of
// 0, 1k, 10k and 100k sandboxes and of 10 sandboxes with 1M events, with
// no daemon and through a daemon started by hand, NEXUS_BENCH_ROUNDS
// rounds each. Every round times each
// command's baseline right after it: `nexus version` (process start, the
// fixed cost every command pays), `cat` of a file the size of what an ls
// printed, `nexus version` plus mkfs.ext4 of the volume's size for the
// one-event append. Fixtures are built by `nexus testfill`, then the
// benchmark waits out the journal's 2-minute de-duplication window, as on
// any root not written to in the last 2 minutes (NEXUS_BENCH_FRESH=1 skips
// the wait; docs/benchmarks.md section 8 says why it matters). It prints
// a table of medians and reports each command's growth factor from 1k to
// the largest size run.
func BenchmarkScaleTable(b *testing.B) {
	// The large fixtures take about 15 s (100k) and 80 s (1M events) to
	// build here; NEXUS_BENCH_LARGE=0 leaves them out for a quick look.
	large := os.Getenv("NEXUS_BENCH_LARGE") != "0"
	if _, err := os.Stat(timeBin); err != nil {
		b.Fatalf("GNU time reports each command's max RSS: %v (make bench installs it)", err)
	}
	rounds := scaleRounds(3)
	img := makeImage(b)
	fixtures := []scaleFixture{{"0", b.TempDir()}}
	sizes := []int{1_000, 10_000}
	if large {
		sizes = append(sizes, 100_000)
	}
	var lastWrite time.Time
	for _, n := range sizes {
		dir := b.TempDir()
		t0 := time.Now()
		runNexus(b, dir, []string{"NEXUS_NO_AUTO_DAEMON=1"}, "testfill", "--sandboxes", strconv.Itoa(n))
		lastWrite = time.Now()
		b.Logf("%d-sandbox fixture built in %v", n, lastWrite.Sub(t0).Round(time.Second))
		fixtures = append(fixtures, scaleFixture{fmt.Sprintf("%dk", n/1000), dir})
	}
	if large {
		dir := b.TempDir()
		t0 := time.Now()
		journalfixture.History(b, dir, 1_000_000)
		lastWrite = time.Now()
		b.Logf("1M-event fixture built in %v", lastWrite.Sub(t0).Round(time.Second))
		fixtures = append(fixtures, scaleFixture{scaleHistoryName, dir})
	}
	if wait := time.Until(lastWrite.Add(dedupeWindow + 5*time.Second)); wait > 0 && os.Getenv("NEXUS_BENCH_FRESH") != "1" {
		b.Logf("waiting %v for the de-duplication window to pass", wait.Round(time.Second))
		time.Sleep(wait)
	}
	modes := []string{"no daemon", "daemon"}
	cells := map[string]map[string]map[string]*scaleCell{} // mode → fixture → op
	daemonStart := map[string][]sample{}                   // fixture → daemon start to serving; RSS at the end
	for _, mode := range modes {
		cells[mode] = map[string]map[string]*scaleCell{}
		for _, f := range fixtures {
			cells[mode][f.name] = runScaleMode(b, f, mode, img, rounds, daemonStart)
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	printScaleTable(os.Stdout, fixtures, modes, cells, daemonStart, rounds, strings.Join(strings.Fields(string(load))[:3], " "))
	// Growth from 1k to the largest root of sandboxes, and to 1M events.
	targets := []string{"10k"}
	if large {
		targets = []string{"100k", scaleHistoryName}
	}
	unit := strings.NewReplacer(" ", "_", ",", "")
	for _, to := range targets {
		for _, mode := range modes {
			for _, op := range scaleOps {
				g := medianOf(cells[mode][to][op].op).d.Seconds() / medianOf(cells[mode]["1k"][op].op).d.Seconds()
				b.ReportMetric(g, unit.Replace(mode+"/"+op+"/growth-1k→"+to))
			}
		}
		b.ReportMetric(daemonStart[to][0].d.Seconds()/daemonStart["1k"][0].d.Seconds(), unit.Replace("daemon-start/growth-1k→"+to))
	}
}

// dedupeWindow is the journal stream's Duplicates window: an open reloads
// the message ids stored within it.
const dedupeWindow = 2 * time.Minute

// runScaleMode copies fixture f into a fresh root and runs the rounds there,
// without a daemon or through one started by hand (its start to serving,
// and its max RSS when the rounds are done, go into daemonStart).
func runScaleMode(b *testing.B, f scaleFixture, mode, img string, rounds int, daemonStart map[string][]sample) map[string]*scaleCell {
	b.Helper()
	root := shortRoot(b)
	if out, err := exec.Command("cp", "-a", f.dir+"/.", root).CombinedOutput(); err != nil {
		b.Fatalf("copy fixture %s: %v: %s", f.name, err, out)
	}
	var env []string
	var d *testutil.Proc
	if mode == "daemon" {
		t0 := time.Now()
		d = startDaemon(b, root)
		daemonStart[f.name] = append(daemonStart[f.name], sample{d: time.Since(t0), rssKB: vmKB(b, d.Cmd.Process.Pid, "VmRSS")})
	} else {
		env = []string{"NEXUS_NO_AUTO_DAEMON=1"}
	}
	scratch := b.TempDir()
	cells := map[string]*scaleCell{}
	for _, op := range scaleOps {
		cells[op] = &scaleCell{}
	}
	record := func(op string, s sample, base sample) {
		cells[op].op = append(cells[op].op, s)
		cells[op].base = append(cells[op].base, base)
	}
	version := func() sample {
		s, _ := runNexus(b, root, env, "version")
		return s
	}
	// cat of a file holding what an ls printed: the cost of moving those
	// bytes through a process into this one.
	cat := func(out []byte) sample {
		p := filepath.Join(scratch, "ls.json")
		if err := os.WriteFile(p, out, 0o644); err != nil {
			b.Fatal(err)
		}
		s, got := runSample(b, nil, "cat", p)
		if len(got) != len(out) {
			b.Fatalf("cat printed %d bytes of %d", len(got), len(out))
		}
		return s
	}
	mkfs := func() sample {
		p := filepath.Join(scratch, "vol.ext4")
		os.Remove(p)
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Truncate(p, 8<<20); err != nil {
			b.Fatal(err)
		}
		s, _ := runSample(b, nil, "mkfs.ext4", "-q", "-F", p)
		return s
	}
	for r := range rounds {
		s, out := runNexus(b, root, env, "--driver", "process", "create", "--image", img, "--handle", fmt.Sprintf("scale-%d", r), "-q")
		id := strings.TrimSpace(string(out))
		record("create", s, version())
		s, out = runNexus(b, root, env, "inspect", id)
		if !strings.Contains(string(out), id) {
			b.Fatalf("inspect %s printed %q", id, out)
		}
		record("inspect ID", s, version())
		s, _ = runNexus(b, root, env, "--driver", "process", "stop", id)
		record("stop", s, version())
		s, _ = runNexus(b, root, env, "--driver", "process", "start", id)
		record("start", s, version())
		for _, op := range []string{"ls --json --limit 100", "ls --json"} {
			s, out = runNexus(b, root, env, strings.Fields(op)...)
			record(op, s, cat(out))
		}
		s, out = runNexus(b, root, env, "events", "--tail", "10")
		if n := bytes.Count(out, []byte("\n")); n != 10 {
			b.Fatalf("events --tail 10 printed %d lines", n)
		}
		record("events --tail 10", s, version())
		vol := fmt.Sprintf("scale-%d", r)
		s, _ = runNexus(b, root, env, "volume", "create", vol, "--size", "8M")
		v, m := version(), mkfs()
		record("volume create (1 event)", s, sample{v.d + m.d, max(v.rssKB, m.rssKB)})
		s, _ = runNexus(b, root, env, "--driver", "process", "rm", "-f", id)
		record("rm -f", s, version())
		runNexus(b, root, env, "volume", "rm", "--yes", vol)
	}
	if d != nil {
		last := &daemonStart[f.name][len(daemonStart[f.name])-1]
		last.rssKB = max(last.rssKB, vmKB(b, d.Cmd.Process.Pid, "VmHWM"))
		d.Stop(b)
	}
	// The next mode's copy needs the room (1M events is about 0.5 GB).
	killProcessesUnder(root)
	os.RemoveAll(root)
	return cells
}

// vmKB reads one Vm* line (kB) of /proc/<pid>/status.
func vmKB(b *testing.B, pid int, field string) int64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// medianOf is the sample of median wall time, with the largest RSS seen.
func medianOf(ss []sample) sample {
	s := slices.Clone(ss)
	slices.SortFunc(s, func(a, b sample) int { return int(a.d - b.d) })
	var rss int64
	for _, x := range s {
		rss = max(rss, x.rssKB)
	}
	return sample{s[len(s)/2].d, rss}
}

func printScaleTable(w io.Writer, fixtures []scaleFixture, modes []string, cells map[string]map[string]map[string]*scaleCell, daemonStart map[string][]sample, rounds int, load string) {
	fmt.Fprintf(w, "\nScale table: median of %d rounds, ms (x its baseline in the same rounds) and max RSS MB; load average %s\n", rounds, load)
	mb := func(kb int64) float64 { return float64(kb) / 1024 }
	growthTo, history := "10k", false
	for _, f := range fixtures {
		switch f.name {
		case "100k":
			growthTo = "100k"
		case scaleHistoryName:
			history = true
		}
	}
	growth := func(mode, op string) (float64, float64) {
		at := func(f string) float64 { return medianOf(cells[mode][f][op].op).d.Seconds() }
		if !history {
			return at(growthTo) / at("1k"), 0
		}
		return at(growthTo) / at("1k"), at(scaleHistoryName) / at("1k")
	}
	hist, histSep, histNone := "", "", ""
	if history {
		hist, histSep, histNone = " 1k→1M ev |", "---|", " — |"
	}
	for _, mode := range modes {
		fmt.Fprintf(w, "\n%s\n\n| command | baseline |", mode)
		for _, f := range fixtures {
			fmt.Fprintf(w, " %s |", f.name)
		}
		fmt.Fprintf(w, " growth 1k→%s |%s\n|---|---|%s---|%s\n", growthTo, hist, strings.Repeat("---|", len(fixtures)), histSep)
		for _, op := range scaleOps {
			base := scaleOpBaseline[op]
			if base == "" {
				base = "`nexus version`"
			}
			fmt.Fprintf(w, "| `%s` | %s |", op, base)
			for _, f := range fixtures {
				c := cells[mode][f.name][op]
				o, bs := medianOf(c.op), medianOf(c.base)
				fmt.Fprintf(w, " %.0f (%.1fx) %.0f MB |", ms(o.d), o.d.Seconds()/bs.d.Seconds(), mb(o.rssKB))
			}
			g, gh := growth(mode, op)
			fmt.Fprintf(w, " %.2fx |", g)
			if history {
				fmt.Fprintf(w, " %.2fx |", gh)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "| baseline `nexus version` | — |")
		for _, f := range fixtures {
			v := medianOf(cells[mode][f.name]["inspect ID"].base)
			fmt.Fprintf(w, " %.0f %.0f MB |", ms(v.d), mb(v.rssKB))
		}
		fmt.Fprintf(w, " — |%s\n", histNone)
		if mode == "daemon" {
			fmt.Fprintf(w, "| daemon start to serving; daemon max RSS | — |")
			for _, f := range fixtures {
				s := daemonStart[f.name][0]
				fmt.Fprintf(w, " %.0f; %.0f MB |", ms(s.d), mb(s.rssKB))
			}
			at := func(f string) float64 { return daemonStart[f][0].d.Seconds() }
			fmt.Fprintf(w, " %.2fx |", at(growthTo)/at("1k"))
			if history {
				fmt.Fprintf(w, " %.2fx |", at(scaleHistoryName)/at("1k"))
			}
			fmt.Fprintln(w)
		}
	}
}

// BenchmarkScaleCreates8 is the table's concurrency row: on one root with a
// daemon started by hand, rounds alternate between 1 client creating 8
// sandboxes one after another and 8 clients creating one each at once, so
// both see the machine in the same state (NEXUS_BENCH_ROUNDS rounds, 5
// unless set). It
// reports creates/s and the p50/p99 latency of one create for each, and
// the ratio 8 clients / 1 client. The sandboxes are removed between
// rounds, outside the clock.
func BenchmarkScaleCreates8(b *testing.B) {
	const clients = 8
	// 5 rounds: 40 creates each way, so the p99 is not just the slowest.
	rounds := scaleRounds(5)
	img := makeImage(b)
	root := shortRoot(b)
	startDaemon(b, root)
	create := func() (time.Duration, string) {
		s, out := runNexus(b, root, nil, "--driver", "process", "create", "--image", img, "-q")
		return s.d, strings.TrimSpace(string(out))
	}
	var one, eight []time.Duration
	var oneWall, eightWall time.Duration
	cleanup := func(ids []string) {
		runNexus(b, root, nil, append([]string{"--driver", "process", "rm", "-f"}, ids...)...)
	}
	for range rounds {
		var ids []string
		t0 := time.Now()
		for range clients {
			d, id := create()
			one, ids = append(one, d), append(ids, id)
		}
		oneWall += time.Since(t0)
		cleanup(ids)

		ids = make([]string, clients)
		lat := make([]time.Duration, clients)
		var wg sync.WaitGroup
		t0 = time.Now()
		for i := range clients {
			wg.Go(func() { lat[i], ids[i] = create() })
		}
		wg.Wait()
		eightWall += time.Since(t0)
		eight = append(eight, lat...)
		cleanup(ids)
	}
	rate1 := float64(len(one)) / oneWall.Seconds()
	rate8 := float64(len(eight)) / eightWall.Seconds()
	b.ReportMetric(rate1, "creates/s-1client")
	b.ReportMetric(rate8, "creates/s-8clients")
	b.ReportMetric(rate8/rate1, "rate-8/1")
	b.ReportMetric(ms(percentile(one, 50)), "p50-ms-1client")
	b.ReportMetric(ms(percentile(eight, 50)), "p50-ms-8clients")
	b.ReportMetric(ms(percentile(one, 99)), "p99-ms-1client")
	b.ReportMetric(ms(percentile(eight, 99)), "p99-ms-8clients")
	b.ReportMetric(float64(percentile(eight, 99))/float64(percentile(one, 99)), "p99-8/1")
}
