package main

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// nodeSubscriber is examples/subscriber-node, which `make setup-test` installs
// (npm ci): a subscriber written against docs/events.md alone, decoding
// with a standard msgpack library.
const nodeSubscriber = "../../examples/subscriber-node"

// listeningDaemon runs `nexus daemon --listen addr` on root until stopped.
func listeningDaemon(t *testing.T, root, addr string) (stop func()) {
	t.Helper()
	d := testutil.Start(t, exec.Command(nexusBin, "--state-dir", root, "daemon", "--listen", addr))
	d.WaitLog(t, 2*time.Minute, `"serving"`)
	return func() { d.Stop(t) }
}

// TestNodeSubscriberFollowsReconnectsAndCatchesUp: the Node.js subscriber
// catches up on history (in pages), follows live events, survives the
// daemon going away while events are appended without it, and ends with
// every journaled event exactly once, in order, decoded as nexus reads it.
func TestNodeSubscriberFollowsReconnectsAndCatchesUp(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(filepath.Join(nodeSubscriber, "node_modules", "nats")); err != nil {
		t.Fatalf("the Node.js subscriber is not installed (run make setup-test): %v", err)
	}
	subscriberFollows(t, func(creds string) *exec.Cmd {
		return exec.Command("node", filepath.Join(nodeSubscriber, "subscriber.cjs"), creds)
	})
}

// TestGoSubscriberFollowsReconnectsAndCatchesUp: the same of
// examples/subscriber-go, built here.
func TestGoSubscriberFollowsReconnectsAndCatchesUp(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "subscriber-go")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/subscriber-go").CombinedOutput(); err != nil {
		t.Fatalf("go build examples/subscriber-go: %v\n%s", err, out)
	}
	subscriberFollows(t, func(creds string) *exec.Cmd { return exec.Command(bin, creds) })
}

// subscriberFollows runs the subscriber command(creds) against a daemon
// listening for subscribers and checks it prints every journaled event
// once, in order, through history pages, live events, and the daemon
// stopped, written to without it, and restarted.
func subscriberFollows(t *testing.T, command func(creds string) *exec.Cmd) {
	root := shortRoot(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	stop := listeningDaemon(t, root, addr)
	mustOK(t, nexus(t, root, "demo"), "demo") // 10 events before it starts

	sub := command(filepath.Join(root, "subscriber.json"))
	sub.Env = append(os.Environ(), "NEXUS_PAGE=4")
	out, err := sub.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	sub.Stderr = &stderr
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Process.Kill(); sub.Wait() })
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var got []string
	await := func(n int, what string) {
		t.Helper()
		deadline := time.After(60 * time.Second)
		for len(got) < n {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("%s: subscriber exited after %d events: %s", what, len(got), stderr.String())
				}
				got = append(got, l)
			case <-deadline:
				t.Fatalf("%s: subscriber printed %d of %d events: %s", what, len(got), n, stderr.String())
			}
		}
	}
	await(10, "history")
	mustOK(t, nexus(t, root, "demo"), "demo")
	await(20, "live")
	stop()
	// Appended while no server listens: only a catch-up can deliver these.
	mustOK(t, nexusEnv(t, root, []string{"NEXUS_NO_AUTO_DAEMON=1"}, "demo"), "demo without a daemon")
	listeningDaemon(t, root, addr)
	await(30, "after the reconnect")
	mustOK(t, nexus(t, root, "demo"), "demo")
	await(40, "live after the reconnect")
	select {
	case l := <-lines:
		t.Fatalf("an event beyond the 40 journaled: %s", l)
	case <-time.After(500 * time.Millisecond):
	}

	want := eventRows(t, root)
	if len(want) != 40 {
		t.Fatalf("journal holds %d events, want 40", len(want))
	}
	for i, l := range got {
		var e struct {
			Seq     uint64 `json:"seq"`
			Subject string `json:"subject"`
			Type    string `json:"type"`
			Sandbox string `json:"sandbox"`
			Schema  int    `json:"schema"`
			ID      string `json:"id"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("subscriber line %q: %v", l, err)
		}
		w := want[i]
		if e.Seq != w.Seq || e.Type != w.Type || e.Sandbox != w.Sandbox || e.Schema == 0 || len(e.ID) != 32 ||
			e.Subject != "nexus.events."+w.Type+"."+w.Sandbox {
			t.Fatalf("subscriber event %d = %s; nexus events says %+v", i+1, l, w)
		}
	}
	if err := sub.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := sub.Wait(); err != nil {
		t.Fatalf("subscriber exit: %v: %s", err, stderr.String())
	}
}
