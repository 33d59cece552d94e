package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startTemplateCluster runs three nats-server nodes in this process,
// clustered over routes, each with its own store, configured from a file
// holding `nexus fleet template` output. It returns the client URL of
// node 0 and the leaf ports.
func startTemplateCluster(t *testing.T, tmpl string) (string, []int) {
	t.Helper()
	const n = 3
	client, route, leaf := make([]int, n), make([]int, n), make([]int, n)
	for i := range n {
		client[i], route[i], leaf[i] = freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)
	}
	dir := t.TempDir()
	var nodes []*server.Server
	for i := range n {
		var routes []string
		for k := range n {
			if k != i {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", route[k]))
			}
		}
		conf := fmt.Sprintf("server_name: node-%d\nlisten: 127.0.0.1:%d\njetstream { store_dir: %q, domain: fleet }\n"+
			"cluster { name: fleet, listen: 127.0.0.1:%d, routes: [%s] }\nleafnodes { listen: 127.0.0.1:%d }\n%s",
			i, client[i], filepath.Join(dir, fmt.Sprint(i)), route[i], strings.Join(routes, ", "), leaf[i], tmpl)
		path := filepath.Join(dir, fmt.Sprintf("node-%d.conf", i))
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		o, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatal(err)
		}
		o.NoLog, o.NoSigs = true, true
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		s.SetLoggerV2(testutil.KeepServerLog(t, fmt.Sprintf("fleet node %d", i)), false, false, false)
		s.Start()
		t.Cleanup(s.Shutdown)
		nodes = append(nodes, s)
	}
	for _, s := range nodes {
		if !s.ReadyForConnections(testutil.Scale(20 * time.Second)) {
			t.Fatal("fleet node not ready")
		}
	}
	waitUntil(t, "a JetStream meta leader", func() bool {
		for _, s := range nodes {
			if s.JetStreamIsLeader() {
				return true
			}
		}
		return false
	})
	return nodes[0].ClientURL(), leaf
}

// startMirroringDaemon runs a daemon of root mirroring as host to every
// leaf port, with the password in NEXUS_MIRROR.
func startMirroringDaemon(t *testing.T, root, host, pass string, leaf []int) {
	t.Helper()
	var urls []string
	for _, p := range leaf {
		urls = append(urls, fmt.Sprintf("nats-leaf://%s:%s@127.0.0.1:%d", host, pass, p))
	}
	mirroringDaemon(t, root, host, strings.Join(urls, ",")).WaitLog(t, 2*time.Minute, "mirror.created")
}

// TestFleetWideReads: two hosts under the template on a real three-node
// cluster, each with a sandbox handled "web" and one more; the auditor
// makes the aggregate with `nexus fleet aggregate`, and `fleet events`,
// `fleet find` and `fleet timeline` answer across both, each row with its
// host, filtered by host, sandbox and type; a followed read sees a new
// event arrive from a host.
func TestFleetWideReads(t *testing.T) {
	testutil.StartsSandboxes(t)
	passes := map[string]string{"host-a": "pass-a", "host-b": "pass-b", "auditor": "pass-audit", "aggregator": "pass-agg", "operator": "pass-op"}
	for user, p := range passes {
		t.Setenv(fleet.PasswordVar(user), p)
	}
	tmpl := mustOK(t, nexus(t, t.TempDir(), "fleet", "template", "--host", "host-a,host-b"), "template").stdout
	clientURL, leaf := startTemplateCluster(t, tmpl)
	roots := map[string]string{"host-a": shortRoot(t), "host-b": shortRoot(t)}
	img := makeImage(t)
	web := map[string]string{}
	for _, h := range []string{"host-a", "host-b"} {
		startMirroringDaemon(t, roots[h], h, passes[h], leaf)
		web[h] = createJSON(t, roots[h], "--handle", "web", "--image", img).ID
	}
	other := createJSON(t, roots["host-b"], "--handle", "db", "--image", img).ID
	mustOK(t, proc(t, roots["host-a"], "rm", "-f", "web"), "rm web on host-a")

	env := []string{"NEXUS_FLEET_URL=" + strings.Replace(clientURL, "nats://", "nats://auditor:pass-audit@", 1)}
	fleet := func(args ...string) result {
		return nexusEnv(t, t.TempDir(), env, append([]string{"fleet"}, args...)...)
	}
	wantFailure(t, fleet("events"), 1, "nexus fleet aggregate")
	wantFailure(t, nexus(t, t.TempDir(), "fleet", "events"), 2, "NEXUS_FLEET_URL")
	aggEnv := []string{"NEXUS_FLEET_URL=" + strings.Replace(clientURL, "nats://", "nats://aggregator:pass-agg@", 1)}
	aggregate := func(args ...string) result {
		return nexusEnv(t, t.TempDir(), aggEnv, append([]string{"fleet", "aggregate"}, args...)...)
	}
	r := mustOK(t, aggregate("--host", "host-a", "--host", "host-b"), "aggregate")
	if !strings.Contains(r.stdout, "sourced from host-a, host-b (added: host-a, host-b)") {
		t.Fatalf("aggregate: %q", r.stdout)
	}
	if r := mustOK(t, aggregate("--host", "host-b"), "aggregate again"); !strings.Contains(r.stdout, "(added: -)") {
		t.Fatalf("aggregate again: %q", r.stdout)
	}
	// The aggregator keeps the aggregate for the rest of the test, and a
	// SIGTERM ends that with success.
	keep := exec.Command(nexusBin, "--state-dir", t.TempDir(), "fleet", "aggregate", "--host", "host-a,host-b", "--keep")
	keep.Env = append(os.Environ(), aggEnv...)
	var keepOut, keepErr testutil.Buffer
	keep.Stdout, keep.Stderr = &keepOut, &keepErr
	if err := keep.Start(); err != nil {
		t.Fatal(err)
	}
	kept := make(chan error, 1)
	go func() { kept <- keep.Wait() }()
	defer func() {
		keep.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-kept:
			if err != nil || t.Failed() {
				t.Errorf("aggregate --keep after SIGTERM: %v\n%s", err, keepErr.String())
			}
		case <-time.After(testutil.Scale(30 * time.Second)):
			keep.Process.Kill()
			t.Errorf("aggregate --keep still running 30 s after SIGTERM:\n%s", keepErr.String())
		}
	}()
	waitUntil(t, "aggregate --keep's first run", func() bool {
		select {
		case err := <-kept:
			t.Fatalf("aggregate --keep ended: %v\n%s", err, keepErr.String())
		default:
		}
		return strings.Contains(keepOut.String(), "(added: -)")
	})

	// Every event of both journals, each with its host and its sequence
	// there, once the mirrors and the aggregate have them.
	journalLen := func(h string) int {
		return strings.Count(mustOK(t, nexus(t, roots[h], "events", "--all", "-q"), "events").stdout, "\n")
	}
	var all []fleetRow
	waitUntil(t, "the aggregate holds both journals", func() bool {
		all = fleetEntries(t, fleet("events", "--json"))
		return len(all) == journalLen("host-a")+journalLen("host-b")
	})
	next := map[string]uint64{}
	for _, e := range all {
		next[e.Host]++
		if e.Seq != next[e.Host] {
			t.Fatalf("%s's events out of order in the aggregate: %+v", e.Host, e)
		}
	}
	if got := fleetEntries(t, fleet("events", "--json", "--host", "host-b", "--type", "sandbox.created")); len(got) != 2 || got[0].Host != "host-b" || got[1].Sandbox != other {
		t.Fatalf("host-b's sandbox.created: %+v", got)
	}
	// A handle is per host: --sandbox web selects both hosts' web.
	webEvents := fleetEntries(t, fleet("events", "--json", "--sandbox", "web", "--type", "sandbox"))
	hosts := map[string]bool{}
	for _, e := range webEvents {
		hosts[e.Host] = true
		if e.Sandbox != web[e.Host] {
			t.Fatalf("--sandbox web gave %+v", e)
		}
	}
	if len(hosts) != 2 {
		t.Fatalf("--sandbox web: hosts %v", hosts)
	}
	text := mustOK(t, fleet("events", "--host", "host-a", "--type", "sandbox.removed"), "events text").stdout
	if !strings.Contains(text, "host-a") || !strings.Contains(text, web["host-a"]) || strings.Count(text, "\n") != 1 {
		t.Fatalf("host-a's sandbox.removed as text: %q", text)
	}

	// find: the handle on both hosts, removed on A, stopped or running on B.
	var found []struct {
		Host, ID, Handle, State string
		Last                    fleetRow `json:"last_event"`
	}
	findOut := mustOK(t, fleet("find", "web", "--json"), "find").stdout
	checkJSON(t, "fleet find --json", reflect.SliceOf(jsonResources["FleetFound"]), json.RawMessage(findOut))
	if err := json.Unmarshal([]byte(findOut), &found); err != nil {
		t.Fatal(err)
	}
	if len(found) != 2 || found[0].Host != "host-a" || found[0].ID != web["host-a"] || found[0].State != "removed" ||
		found[0].Last.Type != "saga.finished" && found[0].Last.Type != "sandbox.removed" ||
		found[1].Host != "host-b" || found[1].ID != web["host-b"] || found[1].State != "running" || found[1].Handle != "web" {
		t.Fatalf("find web: %+v", found)
	}
	if r := mustOK(t, fleet("find", other), "find by id"); !strings.Contains(r.stdout, "host-b") || !strings.Contains(r.stdout, "db") || strings.Contains(r.stdout, "host-a") {
		t.Fatalf("find %s: %q", other, r.stdout)
	}
	if r := mustOK(t, fleet("find", "web", "-q"), "find -q"); r.stdout != web["host-a"]+"\n"+web["host-b"]+"\n" {
		t.Fatalf("find web -q: %q", r.stdout)
	}
	wantFailure(t, fleet("find", "nosuch"), 1, "nosuch")

	// timeline: B's web, every event of it, each with its host.
	var tl []fleetRow
	tlOut := mustOK(t, fleet("timeline", web["host-b"], "--json"), "timeline").stdout
	checkJSON(t, "fleet timeline --json", reflect.SliceOf(jsonResources["FleetEntry"]), json.RawMessage(tlOut))
	if err := json.Unmarshal([]byte(tlOut), &tl); err != nil {
		t.Fatal(err)
	}
	local := strings.Count(mustOK(t, nexus(t, roots["host-b"], "events", "--all", "-q", "--sandbox", web["host-b"]), "local events").stdout, "\n")
	if len(tl) != local || tl[0].Host != "host-b" || tl[0].Type != "saga.started" {
		t.Fatalf("timeline of B's web: %d entries (journal has %d), first %+v", len(tl), local, tl[0])
	}
	if r := mustOK(t, fleet("timeline", "web", "--format", "{{.Host}} {{.Seq}} {{.Type}}"), "timeline --format"); strings.Count(r.stdout, "\n") != len(tl)+strings.Count(mustOK(t, nexus(t, roots["host-a"], "events", "--all", "-q", "--sandbox", web["host-a"]), "local events").stdout, "\n") ||
		!strings.Contains(r.stdout, "host-a ") || !strings.Contains(r.stdout, "host-b ") || !strings.Contains(r.stdout, " saga.started\n") {
		t.Fatalf("timeline web --format: %q", r.stdout)
	}
	if r := mustOK(t, fleet("timeline", web["host-b"]), "timeline table"); !strings.HasPrefix(r.stdout, "HOST") || strings.Count(r.stdout, "\n") != len(tl)+1 {
		t.Fatalf("timeline table: %q", r.stdout)
	}

	// follow: a new sandbox on A arrives with its host.
	f := exec.Command(nexusBin, "fleet", "events", "--follow", "--json", "--host", "host-a", "--type", "sandbox.created",
		"--since", fmt.Sprint(all[len(all)-1].FleetSeq+1))
	f.Env = append(os.Environ(), env...)
	var out testutil.Buffer
	f.Stdout = &out
	if err := f.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		f.Process.Signal(syscall.SIGINT)
		f.Wait()
	}()
	late := createJSON(t, roots["host-a"], "--image", img).ID
	waitUntil(t, "the followed event", func() bool { return strings.Contains(out.String(), late) })
	if e := fleetEntries(t, result{stdout: out.String()}); len(e) != 1 || e[0].Host != "host-a" || e[0].Sandbox != late {
		t.Fatalf("followed: %q", out.String())
	}
}

// fleetRow is a row of `fleet events --json` or `fleet timeline --json`
// (replay.FleetEntry with the payload left raw).
type fleetRow struct {
	Host     string          `json:"host"`
	FleetSeq uint64          `json:"fleet_seq"`
	Seq      uint64          `json:"seq"`
	Type     string          `json:"type"`
	Sandbox  string          `json:"sandbox"`
	Payload  json.RawMessage `json:"payload"`
}

func fleetEntries(t *testing.T, r result) []fleetRow {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var out []fleetRow
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if line == "" {
			continue
		}
		checkJSON(t, "fleet events --json", jsonResources["FleetEntry"], json.RawMessage(line))
		var e fleetRow
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("%v: %q", err, line)
		}
		out = append(out, e)
	}
	return out
}

// TestFleetReadsRunInNexusFleet: the CLI links no NATS client, so a
// fleet-wide read replaces it with nexus-fleet beside it, the same process
// given the same arguments; without nexus-fleet it fails in one line that
// says what is missing, exit 1, having read nothing.
func TestFleetReadsRunInNexusFleet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "nexus")
	copyPlusOne(t, nexusBin, bin)
	env := []string{"NEXUS_FLEET_URL=nats://auditor:pass@127.0.0.1:1"}
	reads := [][]string{{"fleet", "events", "--since", "5"}, {"fleet", "find", "web"}, {"fleet", "timeline", "web", "--json"}}
	for _, args := range reads {
		r := nexusBinEnv(t, bin, t.TempDir(), env, args...)
		wantFailure(t, r, 1, "nexus-fleet, which runs the fleet-wide reads, is not beside "+bin)
		if r.stdout != "" {
			t.Fatalf("%v without nexus-fleet printed %q", args, r.stdout)
		}
	}
	// A stand-in nexus-fleet that says which process it is and what it
	// was given.
	testutil.WriteExecutable(t, filepath.Join(dir, "nexus-fleet"), []byte("#!/bin/sh\necho \"$$ $*\"\n"))
	for _, args := range reads {
		root := t.TempDir()
		cmd := exec.Command(bin, append([]string{"--state-dir", root}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		p := testutil.Run(t, cmd, commandWait)
		want := fmt.Sprintf("%d --state-dir %s %s\n", p.Cmd.Process.Pid, root, strings.Join(args, " "))
		if code := p.Cmd.ProcessState.ExitCode(); code != 0 || p.Stdout.String() != want {
			t.Fatalf("%v: exit %d, stdout %q, want %q (stderr %q)", args, code, p.Stdout.String(), want, p.Stderr.String())
		}
	}
}
