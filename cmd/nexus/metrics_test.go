package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A scrape of the daemon's metrics through nexus.sock during a
// create/fork/rm run shows each saga counted as it ends and the sandboxes
// by state and Ready as `ls` shows them; `nexus daemon metrics` prints
// them, and --metrics-listen serves the same metrics over TCP.
func TestMetricsFollowSagasAndSandboxes(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	d := exec.Command(nexusBin, "--state-dir", root, "daemon", "--metrics-listen", "127.0.0.1:0")
	d.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	p := testutil.Start(t, d)
	p.WaitLog(t, 2*time.Minute, `"serving"`, "msg=serving")
	url := regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+/metrics`).FindString(p.Stderr.String())
	if url == "" {
		t.Fatalf("the daemon did not log its metrics address:\n%s", p.Stderr.String())
	}

	sock := scrapeSocket(root)
	check := func(what string, sagas map[string]float64) map[string]float64 {
		t.Helper()
		got := scrape(t, sock, "http://nexus"+wire.PathMetrics)
		for series, want := range sagas {
			if got[series] != want {
				t.Errorf("%s: %s = %v, want %v", what, series, got[series], want)
			}
		}
		want := map[string]float64{}
		for _, sb := range sandboxes(t, root) {
			want[fmt.Sprintf(`nexus_sandboxes{ready="%t",state="%s"}`, sb.Ready, sb.State)]++
		}
		for series, v := range got {
			if strings.HasPrefix(series, "nexus_sandboxes{") && v != want[series] {
				t.Errorf("%s: %s = %v, want %v (ls)", what, series, v, want[series])
			}
		}
		for series, v := range want {
			if got[series] != v {
				t.Errorf("%s: %s = %v, want %v (ls)", what, series, got[series], v)
			}
		}
		if t.Failed() {
			t.Fatalf("%s: the scrape:\n%s", what, dumpSeries(got, "nexus_"))
		}
		return got
	}

	created := `nexus_sagas_total{kind="create",outcome="finished"}`
	forked := `nexus_sagas_total{kind="fork",outcome="finished"}`
	removed := `nexus_sagas_total{kind="rm",outcome="finished"}`
	check("before any command", map[string]float64{created: 0, forked: 0, removed: 0})
	sb := createJSON(t, root, "--image", image)
	got := check("after create", map[string]float64{created: 1, forked: 0, removed: 0})
	if got[`nexus_saga_duration_seconds_count{kind="create",outcome="finished"}`] != 1 {
		t.Errorf("after create: no create duration observed:\n%s", dumpSeries(got, "nexus_saga"))
	}
	steps := 0.0
	for series, v := range got {
		if strings.HasPrefix(series, `nexus_saga_steps_total{kind="create",`) {
			steps += v
		}
	}
	if steps == 0 {
		t.Errorf("after create: no create step counted:\n%s", dumpSeries(got, "nexus_saga"))
	}
	// A fork of --count N is N fork sagas, one per child.
	mustOK(t, proc(t, root, "fork", sb.ID, "--count", "2"), "fork")
	check("after fork", map[string]float64{created: 1, forked: 2, removed: 0})
	mustOK(t, proc(t, root, "rm", "-f", sb.ID), "rm")
	got = check("after rm", map[string]float64{created: 1, forked: 2, removed: 1})
	if got["nexus_journal_records"] == 0 || got["nexus_journal_free_bytes"] == 0 || got[`nexus_append_duration_seconds_count{result="ok"}`] == 0 {
		t.Errorf("journal and append metrics missing:\n%s", dumpSeries(got, "nexus_"))
	}

	if out := mustOK(t, nexus(t, root, "daemon", "metrics"), "daemon metrics").stdout; !strings.Contains(out, removed+" 1\n") {
		t.Errorf("nexus daemon metrics does not count the rm:\n%s", out)
	}
	tcp := scrape(t, http.DefaultClient, url)
	for _, series := range []string{created, forked, removed} {
		if tcp[series] != got[series] {
			t.Errorf("--metrics-listen: %s = %v, the socket says %v", series, tcp[series], got[series])
		}
	}
	for series, v := range got {
		if strings.HasPrefix(series, "nexus_sandboxes{") && tcp[series] != v {
			t.Errorf("--metrics-listen: %s = %v, the socket says %v", series, tcp[series], v)
		}
	}
}

// scrapeSocket is an HTTP client whose every connection is the daemon's
// socket under root.
func scrapeSocket(root string) *http.Client {
	sock := filepath.Join(root, wire.SocketName)
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

// scrape reads a Prometheus text exposition into its samples, each named
// as it is printed (name{label="value",...}, labels in name order).
func scrape(t *testing.T, c *http.Client, url string) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: %s: %s", url, resp.Status, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("scrape %s: line %q", url, line)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return out
}

func dumpSeries(m map[string]float64, prefix string) string {
	var b strings.Builder
	for series, v := range m {
		if strings.HasPrefix(series, prefix) && !strings.Contains(series, "_bucket{") {
			fmt.Fprintf(&b, "%s %v\n", series, v)
		}
	}
	return b.String()
}
