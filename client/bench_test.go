package client_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// BenchmarkGetVsCLI is one call's cost through the client, which asks the
// daemon over its socket, against the same read made by spawning the CLI
// (`nexus inspect --json`, as the client did per call before), the two
// interleaved in one run against one daemon. cli/socket is the ratio.
func BenchmarkGetVsCLI(b *testing.B) {
	testutil.StartsSandboxes(b)
	root := shortRoot(b)
	c := processClient(b, root)
	ctx := context.Background()
	defer c.Close(ctx)
	sb, err := c.Create(ctx, client.CreateSpec{Image: image(b), Ready: client.ReadyWait{NoWait: true}})
	if err != nil {
		b.Fatal(err)
	}
	inspect := func() {
		cmd := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "inspect", "--json", sb.ID)
		cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_RUN_ID=")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("nexus inspect: %v\n%s", err, out)
		}
	}
	inspect() // the CLI's first run pays for the page cache, not the call
	var socket, cli time.Duration
	n := 0
	for b.Loop() {
		t0 := time.Now()
		if _, err := c.Get(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		inspect()
		cli += time.Since(t1)
		socket += t1.Sub(t0)
		n++
	}
	b.ReportMetric(float64(socket.Microseconds())/float64(n), "µs/socket-get")
	b.ReportMetric(float64(cli.Microseconds())/float64(n), "µs/cli-inspect")
	b.ReportMetric(float64(cli)/float64(socket), "cli/socket")
}
