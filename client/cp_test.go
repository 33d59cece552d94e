package client_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// TestAPICopySnapshotsWait: a file goes into a running sandbox's guest and
// back out through the client alone, from a reader and to a writer, from a
// local file and to one; the snapshots of the sandbox are listed and one is
// removed; a wait for stopped returns once the sandbox is stopped. (The
// process driver's guest maps the paths the protocol carries under its
// guest root, not those in a command's arguments: commands use Cwd.)
func TestAPICopySnapshotsWait(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	c := processClient(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(3*time.Minute))
	defer cancel()
	defer c.Close(context.Background())
	if _, err := c.Create(ctx, client.CreateSpec{Image: image(t), Handle: "cp"}); err != nil {
		t.Fatal(err)
	}
	const guest = "/workspace"
	local := t.TempDir()

	payload := bytes.Repeat([]byte("nexus\x00"), 50_000)
	in := guest + "/in.bin"
	if n, err := c.CopyIn(ctx, "cp", in, bytes.NewReader(payload)); err != nil || n != int64(len(payload)) {
		t.Fatalf("copy in: %d bytes, %v; want %d", n, err, len(payload))
	}
	var back bytes.Buffer
	if n, err := c.CopyOut(ctx, "cp", in, &back); err != nil || n != int64(len(payload)) || !bytes.Equal(back.Bytes(), payload) {
		t.Fatalf("copy out: %d bytes, %v, equal %v", n, err, bytes.Equal(back.Bytes(), payload))
	}
	// The exec sees the file the copy wrote: the same guest.
	var out bytes.Buffer
	if st, err := c.Exec(ctx, "cp", client.ExecOptions{Argv: []string{"wc", "-c", "in.bin"}, Cwd: guest, Stdout: &out}); err != nil || st.Code != 0 || !strings.HasPrefix(out.String(), "300000 ") {
		t.Fatalf("wc -c in the guest: %+v %v %q", st, err, out.String())
	}

	script := filepath.Join(local, "run.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho ran\n"), 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CopyFileIn(ctx, "cp", script, guest+"/"); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if st, err := c.Exec(ctx, "cp", client.ExecOptions{Argv: []string{"stat", "-c", "%a", "run.sh"}, Cwd: guest, Stdout: &out}); err != nil || st.Code != 0 || out.String() != "750\n" {
		t.Fatalf("copied into a directory: %+v %v, mode %q; want run.sh with mode 750", st, err, out.String())
	}
	if _, err := c.CopyFileOut(ctx, "cp", in, local); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(local, "in.bin")); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("copied out to a directory: %d bytes, %v", len(got), err)
	}
	if _, err := c.CopyIn(ctx, "cp", "relative/path", strings.NewReader("x")); err == nil || !strings.Contains(err.Error(), "not absolute") {
		t.Fatalf("a relative guest path: %v, want refused", err)
	}
	if _, err := c.CopyOut(ctx, "nosuch", in, &back); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("copy out of no sandbox: %v, want ErrNotFound", err)
	}

	a, err := c.Snapshot(ctx, "cp")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Snapshot(ctx, "cp")
	if err != nil {
		t.Fatal(err)
	}
	list, err := c.Snapshots(ctx, "cp")
	if err != nil || len(list) != 2 || list[0].ID != a || list[1].ID != b || list[0].Handle != "cp" {
		t.Fatalf("snapshots: %+v %v; want %s and %s", list, err, a, b)
	}
	if err := c.RemoveSnapshot(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveSnapshot(ctx, a); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("second snapshot rm: %v, want ErrNotFound", err)
	}
	if list, err := c.Snapshots(ctx, ""); err != nil || len(list) != 1 || list[0].ID != b {
		t.Fatalf("snapshots of the root after an rm: %+v %v; want only %s", list, err, b)
	}

	if sb, err := c.Wait(ctx, "cp", client.ForReady, 0); err != nil || !sb.Ready {
		t.Fatalf("wait ready: %+v %v", sb, err)
	}
	if _, err := c.Stop(ctx, "cp"); err != nil {
		t.Fatal(err)
	}
	if sb, err := c.Wait(ctx, "cp", client.ForStopped, time.Second); err != nil || sb.State != "stopped" {
		t.Fatalf("wait stopped: %+v %v", sb, err)
	}
	if _, err := c.Wait(ctx, "cp", "colour", time.Second); err == nil {
		t.Fatal("an unknown condition was taken")
	}
}
