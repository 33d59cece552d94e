package daemon_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/store"
)

// TestSelfBuildIsTheExecutable: this process's build is the file it runs
// (checked against a stat of os.Executable), and a daemon reports it in
// its Status, both in Ready and through the socket.
func TestSelfBuildIsTheExecutable(t *testing.T) {
	b, err := control.SelfBuild()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if b.Ino != st.Ino || b.Dev != st.Dev || b.Size != fi.Size() || b.MtimeNs != fi.ModTime().UnixNano() {
		t.Fatalf("SelfBuild = %+v; the executable %s is ino %d dev %d, %d bytes, mtime %d", b, exe, st.Ino, st.Dev, fi.Size(), fi.ModTime().UnixNano())
	}
	if b.Path != exe || !strings.Contains(b.String(), exe) {
		t.Fatalf("SelfBuild names %q (%s), want %s", b.Path, b, exe)
	}

	d := startDaemon(t, "")
	if d.status.Build == nil || !d.status.Build.Same(b) {
		t.Fatalf("Ready status build = %v, want %v", d.status.Build, b)
	}
	c := control.NewClient(filepath.Join(d.root, wire.SocketName))
	defer c.Close()
	got, err := c.Status(context.Background())
	if err != nil || got.Build == nil || !got.Build.Same(b) {
		t.Fatalf("Status through the socket: build %v, %v; want %v", got.Build, err, b)
	}
}

// TestCopiedBinaryIsAnotherBuild: a copy of this test binary with one byte
// appended (it still runs) is another build, as an upgraded nexus is,
// though its version and revision are the same.
func TestCopiedBinaryIsAnotherBuild(t *testing.T) {
	if os.Getenv("NEXUS_PRINT_BUILD") == "1" {
		b, err := control.SelfBuild()
		if err != nil {
			os.Exit(3)
		}
		json.NewEncoder(os.Stdout).Encode(b)
		os.Exit(0)
	}
	self, err := control.SelfBuild()
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	cp := filepath.Join(t.TempDir(), "copy")
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(cp, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Write([]byte{0})
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cp, "-test.run=^TestCopiedBinaryIsAnotherBuild$")
	cmd.Env = append(os.Environ(), "NEXUS_PRINT_BUILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the copy: %v", err)
	}
	var other wire.Build
	if err := json.Unmarshal(out, &other); err != nil {
		t.Fatalf("the copy printed %q: %v", out, err)
	}
	if other.Same(self) || other.Path != cp || other.Size != self.Size+1 {
		t.Fatalf("the copy is %s; this binary is %s: want another build, one byte longer", other, self)
	}
	if other.Version != self.Version || other.Revision != self.Revision {
		t.Fatalf("the copy's stamp %q %q differs from %q %q", other.Version, other.Revision, self.Version, self.Revision)
	}
}

// TestRetiringDaemonServesItsClients: a command talking to an on-demand
// daemon when it is asked to retire (here by an exclusive connect, as a
// build replacement does) still gets its next append through, though the
// append opens a new connection (the append stream); other clients are
// told it is retiring; it exits once that command is done, and the
// exclusive connect then owns the store. A retire that stopped accepting
// at once would leave the append no daemon to reach.
func TestRetiringDaemonServesItsClients(t *testing.T) {
	root, done := runDaemon(t, daemon.Options{Auto: true})
	b, err := local.Connect(context.Background(), root, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	owned := make(chan control.Backend, 1)
	go func() {
		o, err := control.ConnectWith(context.Background(), root, control.ConnectOptions{Wait: time.Minute, Exclusive: true, Auto: &control.AutoStart{}, InProcess: local.InProcess{}})
		if err != nil {
			t.Error(err)
		}
		owned <- o
	}()
	// A retire that stops accepting shows as a Status that fails (on a
	// new connection each time, as a new client's).
	testutil.WaitUntil(t, time.Minute, "the daemon retiring", func() bool {
		probe := control.NewClient(filepath.Join(root, wire.SocketName))
		defer probe.Close()
		st, err := probe.Status(context.Background())
		return err != nil || st.Retiring
	})
	if _, err := b.Append(context.Background(), volumeEvent(1)); err != nil {
		t.Fatalf("append by a client of the retiring daemon: %v", err)
	}
	select {
	case <-owned:
		t.Fatal("the exclusive connect got the store while a client of the daemon was still running")
	default:
	}
	b.Close()
	wantExit(t, done, "retired")
	o := <-owned
	if o == nil {
		t.FailNow()
	}
	defer o.Close()
	if _, ok := o.(local.Backend); !ok {
		t.Fatalf("exclusive connect gave %T", o)
	}
	n := 0
	o.Events(context.Background(), store.Query{}, func(store.Record) error { n++; return nil })
	if n != 1 {
		t.Fatalf("%d events in the journal, want the 1 appended while the daemon retired", n)
	}
}
