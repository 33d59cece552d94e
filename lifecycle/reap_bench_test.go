package lifecycle

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/scan"
	"github.com/nexus-sandbox/nexus/layout"
)

// perSandbox is how many reapable resources one committed sandbox leaves:
// raw and workspace disks, three sockets, supervisor, builder, snapshot and
// record directories.
const perSandbox = 9

// benchTree lays out `resources` resources: 90% of them the full set of
// sandboxes the returned view owns, 10% orphaned raw disks of gone ULIDs.
func benchTree(b *testing.B, resources int) (string, *memJournal) {
	b.Helper()
	root := b.TempDir()
	for _, d := range layout.Dirs {
		os.MkdirAll(filepath.Join(root, d), 0o700)
	}
	r := layout.Root(root)
	sandboxes := resources * 9 / 10 / perSandbox
	orphans := resources - sandboxes*perSandbox
	j := newMemJournal()
	view := j.sandboxes
	touch := func(p string) {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < sandboxes; i++ {
		id := ulid.Make().String()
		var res []events.Resource
		for _, f := range []struct {
			kind events.ResourceKind
			path string
		}{
			{events.KindRawDisk, r.RawDisk(id)}, {events.KindWorkspaceDisk, r.WorkspaceDisk(id)},
			{events.KindAPISocket, r.APISocket(id)}, {events.KindVsockSocket, r.VsockSocket(id)}, {events.KindIIDSocket, r.IIDSocket(id)},
		} {
			touch(f.path)
			res = append(res, events.Resource{Kind: f.kind, Path: r.Rel(f.path)})
		}
		for _, d := range []struct {
			kind events.ResourceKind
			path string
		}{
			{events.KindSupervisorState, r.SupervisorDir(id)}, {events.KindBuilderSupervisor, r.BuilderDir(id)},
			{events.KindSnapshot, r.SnapshotsOf(id)}, {events.KindRecord, filepath.Dir(r.Record(id))},
		} {
			os.Mkdir(d.path, 0o700)
			res = append(res, events.Resource{Kind: d.kind, Path: r.Rel(d.path)})
		}
		touch(filepath.Join(r.SupervisorDir(id), "mitm-ca.pem"))
		touch(r.Record(id))
		view.Apply(uint64(i+1), events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process", Resources: res}))
	}
	for i := 0; i < orphans; i++ {
		touch(r.RawDisk(ulid.Make().String()))
	}
	return root, j
}

func countProcs() int {
	names, _ := filepath.Glob("/proc/[0-9]*")
	return len(names)
}

// BenchmarkReapScanClassify measures one dry-run judgement (scan, lease
// probes, ownership index, one /proc scan, the socket gate for every
// orphan, classification) against `find <root> -printf '%p %s\n'` over the
// same tree in the same run, at 1k, 10k and 100k resources.
func BenchmarkReapScanClassify(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			root, j := benchTree(b, n)
			m := &Manager{Root: layout.Root(root), B: j}
			var reapT, findT time.Duration
			var reads, procs, orphans int
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				sc, err := scan.Root(root)
				if err != nil {
					b.Fatal(err)
				}
				leases := probeLeases(root, sc.Entries)
				idx, err := m.journalIndex(context.Background(), sc.Entries)
				if err != nil {
					b.Fatal(err)
				}
				rep := m.judge(ReapOptions{}, sc.Entries, leases, idx, "", sc)
				reapT += time.Since(t0)
				reads, orphans = rep.ProcReads/rep.ProcScans, len(rep.Orphans)
				procs = countProcs()

				find := exec.Command("sh", "-c", "find \"$1\" -printf '%p %s\\n' > /dev/null", "sh", root)
				t1 := time.Now()
				if out, err := find.CombinedOutput(); err != nil {
					b.Fatalf("find: %v %s", err, out)
				}
				findT += time.Since(t1)
				if rep.Scanned != n {
					b.Fatalf("scanned %d, want %d", rep.Scanned, n)
				}
			}
			b.ReportMetric(float64(reapT.Nanoseconds())/float64(b.N), "reap-ns/op")
			b.ReportMetric(float64(findT.Nanoseconds())/float64(b.N), "find-ns/op")
			b.ReportMetric(float64(reapT)/float64(findT), "reap/find")
			b.ReportMetric(float64(reapT.Nanoseconds())/float64(b.N)/float64(n), "ns/resource")
			b.ReportMetric(float64(reads), "cmdline-reads/scan")
			b.ReportMetric(float64(procs), "procs")
			b.ReportMetric(float64(orphans), "orphans")
		})
	}
}
