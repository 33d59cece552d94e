package agent

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
)

// socketPair is both ends of a unix stream socket, the stand-in guest's
// channel.
func socketPair(tb testing.TB) (net.Conn, net.Conn) {
	tb.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			tb.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// BenchmarkCopy: 64 MiB written into and read out of a file through an
// in-process agent session on a unix socket pair, against the same bytes
// copied over a socket pair straight into (and out of) a file, fsynced as
// the agent's write is, by a read/write loop of cat's buffer size (no
// splice). In process, so a CPU profile sees both ends.
func BenchmarkCopy(b *testing.B) {
	const size = 64 << 20
	data := make([]byte, size)
	rand.Read(data)
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	os.WriteFile(src, data, 0o644)
	a := New(Config{FreezeMounts: []string{}})
	host, guest := socketPair(b)
	go a.Serve(guest)
	c := agentproto.NewClient(host)
	defer c.Close()
	ctx := context.Background()
	if _, _, err := c.Hello(ctx); err != nil {
		b.Fatal(err)
	}
	var in, out, rawIn, rawOut time.Duration
	timed := func(sum *time.Duration, f func()) {
		t0 := time.Now()
		f()
		*sum += time.Since(t0)
	}
	raw := func(from, to string) {
		x, y := socketPair(b)
		done := make(chan error, 1)
		go func() {
			f, _ := os.Open(from)
			_, err := catCopy(x, f)
			f.Close()
			x.Close()
			done <- err
		}()
		f, _ := os.Create(to)
		if _, err := catCopy(f, y); err != nil {
			b.Fatal(err)
		}
		f.Sync()
		f.Close()
		y.Close()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(2 * size)
	for i := 0; i < b.N; i++ {
		timed(&in, func() {
			f, _ := os.Open(src)
			defer f.Close()
			if _, err := c.WriteFile(ctx, filepath.Join(dir, "viaagent"), 0, f); err != nil {
				b.Fatal(err)
			}
		})
		timed(&out, func() {
			f, _ := os.Create(filepath.Join(dir, "back"))
			defer f.Close()
			if n, err := c.ReadFile(ctx, filepath.Join(dir, "viaagent"), f); err != nil || n != size {
				b.Fatal(n, err)
			}
			f.Sync()
		})
		timed(&rawIn, func() { raw(src, filepath.Join(dir, "viaraw")) })
		timed(&rawOut, func() { raw(filepath.Join(dir, "viaraw"), filepath.Join(dir, "back")) })
	}
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 / float64(b.N) }
	b.ReportMetric(ms(in), "in-ms")
	b.ReportMetric(ms(rawIn), "raw-in-ms")
	b.ReportMetric(ms(out), "out-ms")
	b.ReportMetric(ms(rawOut), "raw-out-ms")
	b.ReportMetric(float64(in)/float64(rawIn), "in/raw")
	b.ReportMetric(float64(out)/float64(rawOut), "out/raw")
}

// catCopy copies as cat does: read(2) and write(2) of 128 KiB, hiding
// the ends' ReadFrom and WriteTo so Go does not splice.
func catCopy(w io.Writer, r io.Reader) (int64, error) {
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{r}, make([]byte, 128<<10))
}
