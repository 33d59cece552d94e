package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/ext4"
	"github.com/nexus-sandbox/nexus/host/ext4/ext4test"
)

// BenchmarkOverlayRecovery1GiB times `nexus start` of a stopped sandbox
// whose 1 GiB overlay is full (read-only check, private copy, preen,
// growth, checks, publish, then the process-driver boot) against the same
// recovery by hand on the same image in the same run: cp --sparse=always,
// e2fsck -fy, resize2fs (+64 MiB), and that plus an fsync of the result
// (nexus makes its copy durable before publishing it). It also times the
// start of a roomy 1 GiB overlay: the boot and read-only check alone.
//
//	go test ./cmd/nexus -run '^$' -bench OverlayRecovery1GiB -benchtime 1x
func BenchmarkOverlayRecovery1GiB(b *testing.B) {
	dir := b.TempDir()
	template := filepath.Join(dir, "full.ext4")
	ext4test.Make(b, template, 1<<30)
	ext4test.Write(b, template, "marker", []byte(markerText))
	ext4test.Write(b, template, "second", []byte(secondText))
	fillSize := ext4test.Fill(b, template, "fill")
	run := func(name string, args ...string) time.Duration {
		b.Helper()
		t0 := time.Now()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			b.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return time.Since(t0)
	}
	e2fsck, _ := ext4.Lookup("e2fsck")
	resize2fs, _ := ext4.Lookup("resize2fs")
	var nexusT, roomyT, byHand, byHandSync time.Duration
	b.ResetTimer()
	for range b.N {
		root, err := os.MkdirTemp("", "nxb")
		if err != nil {
			b.Fatal(err)
		}
		writeConfig(b, root, 1024)
		image := filepath.Join(dir, "os.raw")
		os.WriteFile(image, []byte("os image"), 0o600)
		nx := func(args ...string) string {
			b.Helper()
			out, err := exec.Command(nexusBin, append([]string{"--state-dir", root, "--driver", "process"}, args...)...).Output()
			if err != nil {
				b.Fatalf("nexus %v: %v", args, err)
			}
			return string(out)
		}
		var sb struct{ ID string }
		json.Unmarshal([]byte(nx("create", "--image", image, "--json")), &sb)
		nx("stop", sb.ID)
		t0 := time.Now()
		nx("start", sb.ID)
		roomyT += time.Since(t0)
		nx("stop", sb.ID)
		img := overlayOf(root, sb.ID)
		os.Remove(img)
		run("cp", "--sparse=always", template, img)
		// The untimed copy's writeback must not run inside the timed start.
		run("sync")
		t0 = time.Now()
		nx("start", sb.ID)
		nexusT += time.Since(t0)
		if got, err := ext4.FileSize(b.Context(), img, "/fill"); err != nil || got != fillSize {
			b.Fatalf("filler after recovery: %d %v", got, err)
		}
		nx("rm", "-f", "--with-snapshots", sb.ID)
		os.RemoveAll(root)

		// By hand, from a source prepared exactly as the sandbox's overlay
		// was: freshly copied from the template and synced, untimed.
		src := filepath.Join(dir, "byhand-src.ext4")
		run("cp", "--sparse=always", template, src)
		run("sync")
		cp := filepath.Join(dir, "byhand.ext4")
		d := run("cp", "--sparse=always", src, cp)
		d += run(e2fsck, "-fy", cp)
		t0 = time.Now()
		if err := os.Truncate(cp, 1<<30+64<<20); err != nil {
			b.Fatal(err)
		}
		d += time.Since(t0)
		d += run(resize2fs, cp)
		byHand += d
		byHandSync += d + run("sync", cp)
		os.Remove(cp)
		os.Remove(src)
	}
	n := float64(b.N)
	b.ReportMetric(nexusT.Seconds()/n, "nexus-start-full-s")
	b.ReportMetric(roomyT.Seconds()/n, "nexus-start-roomy-s")
	b.ReportMetric(byHand.Seconds()/n, "byhand-s")
	b.ReportMetric(byHandSync.Seconds()/n, "byhand+fsync-s")
	b.ReportMetric(float64(nexusT)/float64(byHand), "ratio-vs-byhand")
	b.ReportMetric(float64(nexusT)/float64(byHandSync), "ratio-vs-byhand+fsync")
	b.ReportMetric(float64(nexusT-roomyT)/float64(byHandSync), "recovery-only-ratio-vs-byhand+fsync")
}
