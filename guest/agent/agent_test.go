package agent

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
)

// TestSessionsConcurrently runs the agent in process (so the race detector
// sees its goroutines) with several requests of two sessions in flight at
// once: execs with stdin, file writes and reads, pings.
func TestSessionsConcurrently(t *testing.T) {
	a := New(Config{FreezeMounts: []string{}})
	dir := t.TempDir()
	var wg sync.WaitGroup
	for s := 0; s < 2; s++ {
		host, guest := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- a.Serve(guest) }()
		c := agentproto.NewClient(host)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, _, err := c.Hello(ctx); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				in := strings.Repeat("line\n", 10000)
				var out bytes.Buffer
				st, err := c.Exec(ctx, agentproto.Exec{Argv: []string{"/bin/sh", "-c", "wc -l"}, Stdin: strings.NewReader(in), Stdout: &out})
				if err != nil || st.Code != 0 || strings.TrimSpace(out.String()) != "10000" {
					t.Errorf("exec: %+v %v %q", st, err, out.String())
				}
				p := filepath.Join(dir, "f"+string(rune('a'+i))+string(rune('0'+s)))
				data := bytes.Repeat([]byte{byte(i)}, 300000)
				if _, err := c.WriteFile(ctx, p, 0, bytes.NewReader(data)); err != nil {
					t.Errorf("write: %v", err)
					return
				}
				var back bytes.Buffer
				if _, err := c.ReadFile(ctx, p, &back); err != nil || !bytes.Equal(back.Bytes(), data) {
					t.Errorf("read back: %v", err)
				}
				if err := c.Ping(ctx); err != nil {
					t.Errorf("ping: %v", err)
				}
			}()
		}
		t.Cleanup(func() {
			c.Close()
			if err := <-done; err != nil {
				t.Errorf("session: %v", err)
			}
		})
	}
	wg.Wait()
	// An empty freeze list freezes nothing and says so.
	if paths, err := a.z.Freeze(time.Second); err != nil || len(paths) != 0 {
		t.Fatalf("freeze of nothing: %v %v", paths, err)
	}
	if _, err := a.z.Thaw(); err != nil {
		t.Fatal(err)
	}
}

func TestParseCmdline(t *testing.T) {
	got, err := ParseCmdline("console=ttyS0 nexus.workspace=/work/ nexus.mount=nexus-vol-data:/data quiet", "nexus-workspace")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"nexus-workspace": "/work", "nexus-vol-data": "/data"}
	if len(got) != len(want) || got["nexus-workspace"] != "/work" || got["nexus-vol-data"] != "/data" {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got, _ := ParseCmdline("console=ttyS0", "nexus-workspace"); got["nexus-workspace"] != "/workspace" {
		t.Fatalf("default workspace: %v", got)
	}
	for _, bad := range []string{"nexus.mount=x", "nexus.mount=x:rel", "nexus.workspace=rel", "nexus.mount=a:/x nexus.mount=a:/y"} {
		if _, err := ParseCmdline(bad, "nexus-workspace"); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestMountsParentsFirst: a volume inside the workspace is mounted (and
// bound into the OS root) after the workspace, or the workspace would
// cover it; ties go by path so the order is the same every boot.
func TestMountsParentsFirst(t *testing.T) {
	mounts := map[string]string{"nexus-vol-b": "/workspace/b", "nexus-workspace": "/workspace", "nexus-vol-a": "/data", "nexus-vol-c": "/workspace/b/c"}
	got := byDepth(mounts)
	want := []string{"nexus-vol-a", "nexus-workspace", "nexus-vol-b", "nexus-vol-c"}
	if !slices.Equal(got, want) {
		t.Fatalf("mount order %v, want %v", got, want)
	}
}

// TestInitPath: nexus.init names the image's init by an absolute path;
// none leaves PID 1 with the agent, a relative one is refused.
func TestInitPath(t *testing.T) {
	for cmdline, want := range map[string]string{
		"console=ttyS0 nexus.init=/sbin/init quiet": "/sbin/init",
		"nexus.init=/usr/lib//systemd/systemd":      "/usr/lib/systemd/systemd",
		"console=ttyS0 init=/init":                  "",
	} {
		if got, err := InitPath(cmdline); err != nil || got != want {
			t.Errorf("InitPath(%q) = %q, %v; want %q", cmdline, got, err, want)
		}
	}
	if got, err := InitPath("nexus.init=sbin/init"); err == nil {
		t.Fatalf("a relative init was taken: %q", got)
	}
}
