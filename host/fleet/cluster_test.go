package fleet

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// fleetCluster is three nats-server nodes clustered over routes, each
// with its own store, configured from a file holding the template, as an
// operator would run them.
type fleetCluster struct {
	nodes     []*server.Server
	leafPorts []int
	confs     []string // each node's configuration file
	stores    []string // each node's JetStream store
}

// start runs node i from its configuration file.
func (c *fleetCluster) start(t testing.TB, i int) {
	t.Helper()
	o, err := server.ProcessConfigFile(c.confs[i])
	if err != nil {
		t.Fatalf("node %d config: %v", i, err)
	}
	o.NoLog, o.NoSigs = true, true
	// A loaded test machine can take longer than the 2 s default to
	// finish a handshake.
	o.AuthTimeout = testutil.Scale(30 * time.Second).Seconds()
	o.LeafNode.AuthTimeout = o.AuthTimeout
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLoggerV2(testutil.KeepServerLog(t, fmt.Sprintf("fleet node %d", i)), false, false, false)
	s.Start()
	t.Cleanup(s.Shutdown)
	c.nodes[i] = s
}

// startCluster starts the fleet, on fresh ports each try: a port found
// free can be taken by a parallel test before the node binds it, and a
// node that cannot bind one of its listeners never becomes ready. A
// three-node cluster is seconds of waits: -short skips every test that
// starts one.
func startCluster(t testing.TB, tmpl string) *fleetCluster {
	t.Helper()
	testutil.SkipInShort(t, "runs a three-node fleet cluster")
	var err error
	for try := 1; try <= 3; try++ {
		var c *fleetCluster
		if c, err = tryCluster(t, tmpl); err == nil {
			return c
		}
		t.Logf("fleet cluster, try %d: %v", try, err)
	}
	t.Fatal(err)
	return nil
}

func tryCluster(t testing.TB, tmpl string) (*fleetCluster, error) {
	t.Helper()
	const n = 3
	client, route, leaf := make([]int, n), make([]int, n), make([]int, n)
	for i := range n {
		client[i], route[i], leaf[i] = freePort(t), freePort(t), freePort(t)
	}
	c := &fleetCluster{leafPorts: leaf}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), []byte(tmpl), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := docNodeConf(t)
	for i := range n {
		edits := []string{
			"server_name: fleet-0", fmt.Sprintf("server_name: node-%d", i),
			"listen: 0.0.0.0:4222", fmt.Sprintf("listen: 127.0.0.1:%d", client[i]),
			`store_dir: "/var/lib/nats/jetstream"`, fmt.Sprintf("store_dir: %q", filepath.Join(dir, fmt.Sprint(i))),
			"domain: fleet", "domain: " + fleetDomain,
			"listen: 0.0.0.0:6222", fmt.Sprintf("listen: 127.0.0.1:%d", route[i]),
			"listen: 0.0.0.0:7422", fmt.Sprintf("listen: 127.0.0.1:%d", leaf[i]),
		}
		for k := range n {
			edits = append(edits, fmt.Sprintf("fleet-%d:6222", k), fmt.Sprintf("127.0.0.1:%d", route[k]))
		}
		conf := doc
		for e := 0; e < len(edits); e += 2 {
			if !strings.Contains(conf, edits[e]) {
				t.Fatalf("%s's node configuration no longer has %q, which the fleet tests replace", fleetDoc, edits[e])
			}
			conf = strings.ReplaceAll(conf, edits[e], edits[e+1])
		}
		path := filepath.Join(dir, fmt.Sprintf("node-%d.conf", i))
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		c.confs = append(c.confs, path)
		c.stores = append(c.stores, filepath.Join(dir, fmt.Sprint(i)))
	}
	c.nodes = make([]*server.Server, n)
	for i := range n {
		c.start(t, i)
	}
	shutdown := func() {
		for _, s := range c.nodes {
			s.Shutdown()
		}
	}
	for _, s := range c.nodes {
		if !s.ReadyForConnections(testutil.Scale(20 * time.Second)) {
			shutdown()
			return nil, fmt.Errorf("fleet node %s not ready", s.Name())
		}
	}
	// A meta leader alone is not a formed fleet: until it has every
	// node's JetStream stats it cannot place 3 replicas, and a mirror
	// created then falls back to 1 (as it must) on whichever node; a test
	// that then stops that node finds the mirror offline for good ("stream
	// is offline" until the test gives up).
	deadline := time.Now().Add(testutil.Scale(30 * time.Second))
	for {
		for _, s := range c.nodes {
			if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == n {
				return c, nil
			}
		}
		if time.Now().After(deadline) {
			shutdown()
			return nil, fmt.Errorf("the fleet's JetStream meta leader did not see its %d nodes", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fleetDoc is the operator's page whose node configuration the fleet
// tests run, so the page cannot drift from a configuration that works.
const fleetDoc = "../../docs/fleet.md"

// docNodeConf is the code block of fleetDoc that follows its marker line
// "<!-- nexus-test: node.conf -->".
func docNodeConf(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(fleetDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- nexus-test: node.conf -->\n")
	if !ok {
		t.Fatalf("%s has no node configuration marked for the tests", fleetDoc)
	}
	rest, ok = strings.CutPrefix(rest, "```conf\n")
	block, _, closed := strings.Cut(rest, "\n```")
	if !ok || !closed {
		t.Fatalf("%s: the marked node configuration is not a ```conf block", fleetDoc)
	}
	return block + "\n"
}

// urls are the leaf URLs of every node for user:pass.
func (c *fleetCluster) urls(user, pass string) []*url.URL {
	var out []*url.URL
	for _, p := range c.leafPorts {
		u, _ := url.Parse(fmt.Sprintf("nats-leaf://%s:%s@127.0.0.1:%d", user, pass, p))
		out = append(out, u)
	}
	return out
}

// openFleetHost is mirrorTo as the host's own user, closed at the
// test's end.
func openFleetHost(t testing.TB, c *fleetCluster, name, pass string, check time.Duration) (*journal.Journal, *Mirror) {
	t.Helper()
	j, m := mirrorTo(t, c, name, pass, name, check)
	t.Cleanup(func() { j.Close() })
	return j, m
}

// plainTemplate lets user h (password p) into the fleet's account, with
// no host template.
const plainTemplate = "accounts { FLEET: { jetstream: enabled, users: [{user: h, password: p}] } }\n"

// mirrorTo opens a fresh journal that mirrors, as host, to every node of
// c as user:pass, checking its mirror every check; the caller closes it.
func mirrorTo(t testing.TB, c *fleetCluster, user, pass, host string, check time.Duration) (*journal.Journal, *Mirror) {
	t.Helper()
	m := &Mirror{URLs: c.urls(user, pass), Domain: fleetDomain, Host: host, HostID: ulid.Make().String(), StartWait: 20 * time.Second, Check: check}
	j, err := journal.Open(context.Background(), journal.Options{Dir: filepath.Join(t.TempDir(), "journal"), Mirror: m})
	if err != nil {
		t.Fatal(err)
	}
	return j, m
}

// clientURL is node's client URL for user:pass.
func (c *fleetCluster) clientURL(node int, user, pass string) string {
	u, _ := url.Parse(c.nodes[node].ClientURL())
	u.User = url.UserPassword(user, pass)
	return u.String()
}

// connectJS connects to a fleet server's client URL; the caller closes
// the connection.
func connectJS(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(testutil.Scale(30 * time.Second))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	return nc, js
}

// limitMirror is an operator's change to a mirror's settings: a byte
// limit, which the host must keep and report rather than undo.
func limitMirror(ctx context.Context, t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxBytes = 1 << 30
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// templateFleet is a real three-node fleet cluster under the template of
// its hosts and the auditor "auditor", every user's password set
// (fleetPass).
type templateFleet struct {
	*fleetCluster
	hosts []string
	// check is the hosts' Mirror.Check (0: its default).
	check time.Duration
}

// testMaxBytes is each host account's storage in these tests.
const testMaxBytes = 256 << 20

// fleetPass is a fleet user's password in these tests.
func fleetPass(user string) string { return "pw-" + user }

// startTemplateFleet sets the passwords of hosts and of the auditor, and
// starts a cluster under their template (after edit, if given, rewrote it).
func startTemplateFleet(t testing.TB, hosts []string, edit func(string) string) *templateFleet {
	t.Helper()
	testutil.SkipInShort(t, "starts a fleet cluster")
	for _, u := range append([]string{"auditor", "aggregator", "operator"}, hosts...) {
		t.Setenv(PasswordVar(u), fleetPass(u))
	}
	tmpl, err := Template{Hosts: hosts, Auditor: "auditor", MaxStreams: hostStreams, MaxBytes: testMaxBytes}.Config(fleetDomain)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		tmpl = edit(tmpl)
	}
	return &templateFleet{fleetCluster: startCluster(t, tmpl), hosts: hosts}
}

// openHosts opens every host's journal mirroring to the fleet, in order,
// and appends events events to each.
func (f *templateFleet) openHosts(t testing.TB, events int) ([]*journal.Journal, []*Mirror) {
	t.Helper()
	js, ms := make([]*journal.Journal, len(f.hosts)), make([]*Mirror, len(f.hosts))
	for i, h := range f.hosts {
		js[i], ms[i] = openFleetHost(t, f.fleetCluster, h, fleetPass(h), f.check)
		if events > 0 {
			appendN(t, js[i], 0, events)
		}
	}
	return js, ms
}

// mirrorIsJournal waits for the auditor to read n messages in host's
// mirror m, and checks they are host's journal j, in order, each as
// "<host>.<subject> <data>".
func mirrorIsJournal(t *testing.T, audit jetstream.JetStream, host string, j *journal.Journal, m *Mirror, n int) {
	t.Helper()
	got := awaitAudited(t, audit, m.StreamName(), n)
	want := readAll(t, j, 1, "")
	if len(got) != n || len(want) != n {
		t.Fatalf("%s: mirror %d, journal %d, want %d", m.StreamName(), len(got), len(want), n)
	}
	for k, r := range want {
		if got[k] != host+"."+r.Subject+" "+string(r.Data) {
			t.Fatalf("%s message %d = %q, journal has %s %q", m.StreamName(), k+1, got[k], r.Subject, r.Data)
		}
	}
}

// auditorURL is node's client URL with the auditor's credentials.
func (f *templateFleet) auditorURL(node int) string { return f.userURL("auditor", node) }

// userURL is node's client URL with user's credentials.
func (f *templateFleet) userURL(user string, node int) string {
	return fmt.Sprintf("nats://%s:%s@%s", user, fleetPass(user), strings.TrimPrefix(f.nodes[node].ClientURL(), "nats://"))
}

// auditor is the auditor's JetStream at node, through the audit API
// prefix, closed when the test ends.
func (f *templateFleet) auditor(t testing.TB, node int) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(f.nodes[node].ClientURL(), nats.Timeout(testutil.Scale(30*time.Second)), nats.UserInfo("auditor", fleetPass("auditor")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithAPIPrefix(nc, AuditAPIPrefix)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// attacker is a server of an attacker's own, linked to the fleet as host
// with the host's stolen identity, and a connection to it; both end with
// the test. It returns once the link carries the fleet's JetStream API
// for the host's own mirror: a link counts as up before the hub has sent
// the interest it serves, and a request sent then finds no responders,
// which is neither a refusal nor an answer.
func (f *templateFleet) attacker(t *testing.T, host string) *nats.Conn {
	t.Helper()
	ao := &server.Options{ServerName: "attacker-" + host, DontListen: true, NoLog: true, NoSigs: true}
	ao.LeafNode.Remotes = []*server.RemoteLeafOpts{{URLs: f.urls(host, fleetPass(host))}}
	atk, err := server.NewServer(ao)
	if err != nil {
		t.Fatal(err)
	}
	atk.SetLoggerV2(testutil.KeepServerLog(t, "attacker-"+host), false, false, false)
	atk.Start()
	t.Cleanup(atk.Shutdown)
	if !atk.ReadyForConnections(testutil.Scale(10 * time.Second)) {
		t.Fatal("attacker server not ready")
	}
	api := "$JS." + fleetDomain + ".API.STREAM.INFO." + MirrorStream(host)
	deadline := time.Now().Add(testutil.Scale(20 * time.Second))
	for atk.NumLeafNodes() == 0 || !atk.GlobalAccount().SubscriptionInterest(api) {
		if time.Now().After(deadline) {
			t.Fatalf("attacker linked to %d nodes, the fleet's JetStream API (%s) not reachable over them", atk.NumLeafNodes(), api)
		}
		time.Sleep(50 * time.Millisecond)
	}
	anc, err := nats.Connect("", nats.InProcessServer(atk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(anc.Close)
	return anc
}

// auditorRead reads a mirror as the auditor: info, then every message by
// sequence, the only requests the template lets an auditor send.
func auditorRead(t *testing.T, js jetstream.JetStream, stream string) (jetstream.StreamConfig, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(60*time.Second))
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("auditor: stream %s: %v", stream, err)
	}
	info := s.CachedInfo()
	var out []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("auditor: %s seq %d: %v", stream, seq, err)
		}
		out = append(out, m.Subject+" "+string(m.Data))
	}
	return info.Config, out
}

func awaitAudited(t *testing.T, js jetstream.JetStream, stream string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(testutil.Scale(60 * time.Second))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(10*time.Second))
		s, err := js.Stream(ctx, stream)
		cancel()
		if err == nil && s.CachedInfo().State.Msgs >= uint64(n) {
			_, got := auditorRead(t, js, stream)
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reach %d messages (last error %v)", stream, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFleetTemplateIsolatesHosts runs the printed template on a real
// three-node JetStream cluster with two hosts and proves: mirrors default
// to 3 replicas; the auditor reads every mirror and changes none; host A's
// identity cannot be used as a client, and over a leaf link it cannot
// read, delete, purge or replace B's mirror, nor delete or purge its own.
func TestFleetTemplateIsolatesHosts(t *testing.T) {
	testutil.SkipInShort(t, "runs a three-node fleet cluster")
	c := startTemplateFleet(t, []string{"host-a", "host-b"}, nil)
	c.check = time.Second // the hosts report within a second
	js, ms := c.openHosts(t, 0)
	a, b, ma, mb := js[0], js[1], ms[0], ms[1]
	appendN(t, a, 0, 4)
	appendN(t, b, 100, 6)

	ajs := c.auditor(t, 0)
	gotA := awaitAudited(t, ajs, ma.StreamName(), 4)
	gotB := awaitAudited(t, ajs, mb.StreamName(), 6)
	if cfg, _ := auditorRead(t, ajs, mb.StreamName()); cfg.Replicas != 3 {
		t.Fatalf("mirror made with %d replicas on a 3-node fleet, want 3", cfg.Replicas)
	}
	if !strings.HasPrefix(gotB[0], "host-b.nexus.events.") || !strings.HasSuffix(gotB[0], "event 100") {
		t.Fatalf("B's mirror starts %q", gotB[0])
	}

	// One bound for the rest of the test: the attempts below, B's appends
	// and the auditor's reads all share it.
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	// The auditor is read-only.
	if err := ajs.DeleteStream(ctx, mb.StreamName()); err == nil {
		t.Fatal("the auditor deleted B's mirror")
	}
	if _, err := ajs.CreateStream(ctx, jetstream.StreamConfig{Name: "X", Subjects: []string{"x"}}); err == nil {
		t.Fatal("the auditor created a stream")
	}

	// A's password is for leaf links only.
	if nc, err := nats.Connect(c.nodes[0].ClientURL(), nats.Timeout(testutil.Scale(30*time.Second)), nats.UserInfo("host-a", fleetPass("host-a"))); err == nil {
		nc.Close()
		t.Fatal("host-a's identity connected as a client")
	}

	// An attacker holding A's identity links a server of its own as A.
	anc := c.attacker(t, "host-a")
	var seenB atomic.Int64
	sub, _ := anc.Subscribe(">", func(m *nats.Msg) {
		// The attacker's own requests name B's stream; B's events never
		// reach A's account.
		if strings.HasPrefix(m.Subject, "host-b.") || strings.Contains(string(m.Data), "event 10") {
			seenB.Add(1)
		}
	})
	defer sub.Unsubscribe()
	fjs, _ := jetstream.NewWithDomain(anc, fleetDomain)
	try := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 3*time.Second) }

	c1, x1 := try()
	if s, err := fjs.Stream(c1, mb.StreamName()); err == nil {
		t.Fatalf("A read B's mirror: %+v", s.CachedInfo().State)
	}
	x1()
	c2, x2 := try()
	if err := fjs.DeleteStream(c2, mb.StreamName()); err == nil {
		t.Fatal("A deleted B's mirror")
	}
	x2()
	c3, x3 := try()
	// A replacement of B's mirror: a stream of that name fed from A.
	fjs.CreateStream(c3, jetstream.StreamConfig{Name: mb.StreamName(), Mirror: &jetstream.StreamSource{Name: journal.StreamName, Domain: ma.localDomain()}})
	x3()
	c4, x4 := try()
	if err := fjs.DeleteStream(c4, ma.StreamName()); err == nil {
		t.Fatal("A deleted its own mirror")
	}
	x4()
	c5, x5 := try()
	if s, err := fjs.Stream(c5, ma.StreamName()); err == nil {
		if err := s.Purge(c5); err == nil {
			t.Fatal("A purged its own mirror")
		}
	}
	x5()
	// A may not update its mirror (cutting it to its last 5 records), nor
	// its report stream, nor delete that, nor make a stream of another name.
	refusedAll(t, map[string]func(context.Context) error{
		"A updated its own mirror's limits": func(ctx context.Context) error {
			cfg := mirrorConfig(t, ajs, ma.StreamName())
			cfg.MaxMsgs = 5
			_, err := fjs.UpdateStream(ctx, cfg)
			return err
		},
		"A updated its report stream": func(ctx context.Context) error {
			_, err := fjs.UpdateStream(ctx, jetstream.StreamConfig{Name: ReportStream("host-a"), Subjects: []string{ReportSubject}, MaxMsgsPerSubject: 1000})
			return err
		},
		"A deleted its report stream": func(ctx context.Context) error { return fjs.DeleteStream(ctx, ReportStream("host-a")) },
		"A made a stream of its own": func(ctx context.Context) error {
			_, err := fjs.CreateStream(ctx, jetstream.StreamConfig{Name: "EXTRA", Subjects: []string{"extra"}})
			return err
		},
	})
	if cfg := mirrorConfig(t, ajs, ma.StreamName()); cfg.MaxMsgs != -1 {
		t.Fatalf("A's mirror limits changed: max msgs %d", cfg.MaxMsgs)
	}

	// B keeps appending; its mirror, as the auditor reads it, is exactly
	// B's journal, and A's is intact.
	appendN(t, b, 106, 2)
	if got := awaitAudited(t, ajs, mb.StreamName(), 8); len(got) != 8 || got[0] != gotB[0] || !strings.HasSuffix(got[7], "event 107") {
		t.Fatalf("B's mirror after A's attempts: %q", got)
	}
	if got := awaitAudited(t, ajs, ma.StreamName(), 4); len(got) != 4 || got[0] != gotA[0] {
		t.Fatalf("A's mirror after its attempts: %q", got)
	}
	// replay reads B's mirror as the auditor, by sequence, ids kept.
	auditURL := c.auditorURL(1)
	var recs []journal.Record
	if err := ReadMirror(ctx, auditURL, "", AuditAPIPrefix, mb.StreamName(), func(r journal.Record) error {
		recs = append(recs, r)
		return nil
	}, nil); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 8 || recs[0].Seq != 1 || recs[0].MsgID != "m-100" || recs[7].MsgID != "m-107" {
		t.Fatalf("auditor's replay of B: %d records, first %+v", len(recs), recs[0])
	}
	time.Sleep(500 * time.Millisecond)
	if n := seenB.Load(); n != 0 {
		t.Fatalf("A's link saw %d of B's messages", n)
	}
	// Status from each host: linked, current, three replicas, its report
	// read from its report stream.
	deadline := time.Now().Add(testutil.Scale(30 * time.Second))
	for {
		st := mb.State(context.Background())
		if st.Connected && st.Exists && st.LagEvents == 0 && st.MirrorLastSeq == 8 && st.MirrorFirstSeq == 1 && st.Replicas == 3 && st.ReportedSeq == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B's mirror state: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The auditor reads the same report, through its imports.
	if rep, err := readReport(ctx, ajs, "host-b", mb.HostID); err != nil || rep.LastSeq != 8 {
		t.Fatalf("B's report as the auditor reads it: %+v, %v", rep, err)
	}
}

// refusedAll runs every attempt at once and fails unless each is
// refused. A request the permissions refuse goes unanswered, so each
// waits a few seconds at most; at once, the whole costs that once.
func refusedAll(t *testing.T, attempts map[string]func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(3*time.Second))
	defer cancel()
	type result struct {
		what string
		err  error
	}
	done := make(chan result, len(attempts))
	for what, do := range attempts {
		go func() { done <- result{what, do(ctx)} }()
	}
	for range attempts {
		if r := <-done; r.err == nil {
			t.Errorf("%s", r.what)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// mirrorConfig is stream's configuration as js reads it.
func mirrorConfig(t *testing.T, js jetstream.JetStream, stream string) jetstream.StreamConfig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(10*time.Second))
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("%s: %v", stream, err)
	}
	return s.CachedInfo().Config
}

// TestFleetNodeLoss: with replicas 3, killing the node each host is linked
// to loses nothing: the links move to the other nodes, the mirrors keep
// every event, in order, identical to the journals, and status says so.
func TestFleetNodeLoss(t *testing.T) {
	testutil.SkipInShort(t, "runs a three-node fleet cluster")
	hosts := []string{"host-a", "host-b", "host-c"}
	c := startTemplateFleet(t, hosts, nil)
	js, ms := c.openHosts(t, 5)
	audit := func(node int) jetstream.JetStream { return c.auditor(t, node) }
	a2 := audit(2)
	for _, m := range ms {
		awaitAudited(t, a2, m.StreamName(), 5)
		// A mirror of 1 replica goes offline with its node: the loss
		// below proves something only of 3.
		if cfg, _ := auditorRead(t, a2, m.StreamName()); cfg.Replicas != 3 {
			t.Fatalf("%s has %d replicas, want 3", m.StreamName(), cfg.Replicas)
		}
	}
	// Kill the node holding the most links, then the hosts keep appending.
	victim := 0
	for i, n := range c.nodes {
		if n.NumLeafNodes() > c.nodes[victim].NumLeafNodes() {
			victim = i
		}
	}
	if c.nodes[victim].NumLeafNodes() == 0 {
		t.Fatal("no node holds a link")
	}
	c.nodes[victim].Shutdown()
	c.nodes[victim].WaitForShutdown()
	for _, j := range js {
		appendN(t, j, 5, 5)
	}
	reader := a2
	if victim == 2 {
		reader = audit(1)
	}
	for i, m := range ms {
		mirrorIsJournal(t, reader, hosts[i], js[i], m, 10)
		deadline := time.Now().Add(testutil.Scale(30 * time.Second))
		for {
			st := ms[i].State(context.Background())
			if st.Connected && st.Exists && st.LagEvents == 0 && st.MirrorLastSeq == 10 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s status after the node loss: %+v", hosts[i], st)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestFleetNodeStoreLoss: with replicas 3, a node whose store is lost
// comes back empty and the mirrors, read from that very node, are whole
// and equal to the journals.
func TestFleetNodeStoreLoss(t *testing.T) {
	testutil.SkipInShort(t, "runs a three-node fleet cluster")
	hosts := []string{"host-a", "host-b"}
	c := startTemplateFleet(t, hosts, nil)
	js, ms := c.openHosts(t, 20)
	auditAt := func(node int) jetstream.JetStream { return c.auditor(t, node) }
	a0 := auditAt(0)
	for _, m := range ms {
		awaitAudited(t, a0, m.StreamName(), 20)
	}
	const lost = 1
	c.nodes[lost].Shutdown()
	c.nodes[lost].WaitForShutdown()
	if err := os.RemoveAll(c.stores[lost]); err != nil {
		t.Fatal(err)
	}
	for _, j := range js {
		appendN(t, j, 20, 5)
	}
	c.start(t, lost)
	if !c.nodes[lost].ReadyForConnections(testutil.Scale(20 * time.Second)) {
		t.Fatal("node not back")
	}
	// Each mirror's replica on the emptied node is rebuilt from its peers:
	// wait until that node reports it current, then compare.
	for i, m := range ms {
		deadline := time.Now().Add(testutil.Scale(60 * time.Second))
		for {
			if localMsgs(c.nodes[lost], HostAccount(hosts[i]), m.StreamName()) == 25 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not rebuilt on the emptied node", m.StreamName())
			}
			time.Sleep(100 * time.Millisecond)
		}
		mirrorIsJournal(t, a0, hosts[i], js[i], m, 25)
	}
}

// localMsgs is how many messages node's own replica of stream holds.
func localMsgs(node *server.Server, account, stream string) uint64 {
	jsz, err := node.Jsz(&server.JSzOptions{Account: account, Streams: true})
	if err != nil {
		return 0
	}
	for _, a := range jsz.AccountDetails {
		for _, s := range a.Streams {
			if s.Name == stream {
				return s.State.Msgs
			}
		}
	}
	return 0
}

// TestFleetWholeClusterOutage: every node down; the hosts keep appending
// without waiting on the fleet, status says the link is down, and once the
// nodes are back the mirrors catch up to exactly the journals, and the
// aggregate, kept by the aggregator throughout, holds each host event
// once.
func TestFleetWholeClusterOutage(t *testing.T) {
	testutil.SkipInShort(t, "runs a three-node fleet cluster")
	hosts := []string{"host-a", "host-b"}
	c := startTemplateFleet(t, hosts, nil)
	// Each host's events have IDs of their own, as journal event IDs
	// (ULIDs) are: the aggregate de-duplicates by ID.
	js, ms := c.openHosts(t, 0)
	for i, j := range js {
		appendN(t, j, 1000*i, 5)
	}
	for i := range js {
		deadline := time.Now().Add(testutil.Scale(30 * time.Second))
		for st := ms[i].State(context.Background()); st.MirrorLastSeq != 5; st = ms[i].State(context.Background()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s never current: %+v", hosts[i], st)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// The aggregator keeps the aggregate through the outage.
	agg, err := DialAggregator(c.userURL("aggregator", 0), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	kept := make(chan struct{})
	var keepLog testutil.Buffer
	go func() {
		defer close(kept)
		agg.KeepAggregate(ctx, hosts, 0, KeepInterval, KeepResumeEvery, func(s string) { fmt.Fprintf(&keepLog, "%s %s\n", time.Now().Format("15:04:05.000"), s) })
	}()
	defer func() {
		cancel()
		<-kept
		agg.Close()
		t.Logf("the aggregator's reports:\n%s", keepLog.String())
	}()
	aggregateHolds(t, aggregateReader(t, c), 10)

	for _, n := range c.nodes {
		n.Shutdown()
		n.WaitForShutdown()
	}
	// The journal does not wait on the fleet: these appends end while
	// every node is down (appendN's bound fails the test otherwise).
	for i, j := range js {
		appendN(t, j, 1000*i+5, 10)
	}
	for i := range js {
		deadline := time.Now().Add(testutil.Scale(10 * time.Second))
		for st := ms[i].State(context.Background()); st.Connected; st = ms[i].State(context.Background()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s reports a link with every node down", hosts[i])
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i := range c.nodes {
		c.start(t, i)
	}
	back := time.Now()
	for i := range js {
		deadline := time.Now().Add(testutil.Scale(2 * time.Minute))
		for {
			st := ms[i].State(context.Background())
			if st.Connected && st.Exists && st.MirrorLastSeq == 15 && st.LagEvents == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s after the outage: %+v", hosts[i], st)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Logf("mirrors current %v after the cluster came back", time.Since(back).Round(time.Millisecond))
	a := c.auditor(t, 0)
	for i, m := range ms {
		mirrorIsJournal(t, a, hosts[i], js[i], m, 15)
	}
	// The aggregate holds each host event once.
	aggregateHolds(t, aggregateReader(t, c), 30)
	t.Logf("aggregate current %v after the cluster came back", time.Since(back).Round(time.Millisecond))
}
