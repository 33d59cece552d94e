package local

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/store"
)

// BenchmarkReapApply10k measures `reap --apply` of 10,000 orphans end to
// end against a real journal (scan, judge, plan and result events, the
// batched symlink-safe deletes, the verify pass, the directory fsync)
// against `rm -rf` of the same 10,000 files, in the same run.
func BenchmarkReapApply10k(b *testing.B) {
	const orphans = 10000
	ctx := context.Background()
	var reapT, rmT time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		root := b.TempDir()
		n, err := store.Open(ctx, root, store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		m := &lifecycle.Manager{Root: layout.Root(root), B: Backend{Store: n}}
		other := filepath.Join(b.TempDir(), "disks")
		os.MkdirAll(filepath.Join(root, "disks"), 0o700)
		os.MkdirAll(other, 0o700)
		for k := 0; k < orphans; k++ {
			name := ulid.Make().String() + ".raw"
			os.WriteFile(filepath.Join(root, "disks", name), []byte("x"), 0o600)
			os.WriteFile(filepath.Join(other, name), []byte("x"), 0o600)
		}
		b.StartTimer()
		t0 := time.Now()
		rep, err := m.Reap(ctx, lifecycle.ReapOptions{Apply: true})
		reapT += time.Since(t0)
		b.StopTimer()
		if err != nil || len(rep.Deleted) != orphans || len(rep.Failed) != 0 {
			b.Fatalf("apply: %v deleted %d failed %d kept %d", err, len(rep.Deleted), len(rep.Failed), len(rep.Kept))
		}
		n.Close()
		t1 := time.Now()
		if out, err := exec.Command("rm", "-rf", other).CombinedOutput(); err != nil {
			b.Fatalf("rm -rf: %v %s", err, out)
		}
		rmT += time.Since(t1)
		b.StartTimer()
	}
	b.ReportMetric(float64(reapT.Nanoseconds())/float64(b.N), "reap-ns/op")
	b.ReportMetric(float64(rmT.Nanoseconds())/float64(b.N), "rm-ns/op")
	b.ReportMetric(float64(reapT)/float64(rmT), "reap/rm")
}
