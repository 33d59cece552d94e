package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// fleetRecords scans the whole aggregate (or what filters select).
func fleetRecords(t *testing.T, f *Auditor, filters ...string) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(20*time.Second))
	defer cancel()
	var out []Record
	if err := f.Scan(ctx, journal.Range{Filters: filters}, func(r Record) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// forgerUser is a user the aggregate tests add to the auditors' account,
// allowed everything there: what an operator's mistake or a stolen
// operator identity could store in the aggregate.
const forgerUser = `{ user: "forger", password: "forger" }`

// TestFleetAggregate: on a real three-node fleet under the template, the
// aggregator creates the aggregate from two hosts' mirrors (extending it
// adds, never drops), and the auditor reads every host's records with its
// host and its sequence in that host's journal, filtered by host on the
// server, followed live, leaving no consumer behind. The auditor can
// neither make, change, delete nor purge the aggregate, nor the aggregator
// delete or purge it. A mirror the operator deletes comes back and the
// aggregate still holds each host record once; a record stored in the
// aggregate by other means than its sourcing is reported and skipped.
func TestFleetAggregate(t *testing.T) {
	const auditUsers = `users: [`
	c := startTemplateFleet(t, []string{"host-a", "host-b"}, func(tmpl string) string {
		i := strings.Index(tmpl, AuditAccount+": {")
		if i < 0 || !strings.Contains(tmpl[i:], auditUsers) {
			t.Fatalf("template changed shape:\n%s", tmpl)
		}
		return tmpl[:i] + strings.Replace(tmpl[i:], auditUsers, auditUsers+forgerUser+",", 1)
	})
	c.check = 500 * time.Millisecond
	js, ms := c.openHosts(t, 0)
	a, b, mb := js[0], js[1], ms[1]
	appendN(t, a, 0, 4)
	appendN(t, b, 100, 6)

	dial := func(url string) *Auditor {
		f, err := Dial(url, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.Close)
		return f
	}
	f, agg := dial(c.auditorURL(1)), dial(c.userURL("aggregator", 2))
	var rejected []Rejected
	f.Reject = func(r Rejected) { rejected = append(rejected, r) }
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(3*time.Minute))
	defer cancel()
	if err := f.Scan(ctx, journal.Range{}, func(Record) error { return nil }); err == nil || !strings.Contains(err.Error(), "nexus fleet aggregate") {
		t.Fatalf("a read before the aggregate exists: %v", err)
	}
	refusedAll(t, map[string]func(context.Context) error{
		"the auditor made the aggregate": func(ctx context.Context) error {
			_, err := f.EnsureAggregate(ctx, []string{"host-a"}, 1)
			return err
		},
	})
	if added, err := agg.EnsureAggregate(ctx, []string{"host-a"}, 0); err != nil || len(added) != 1 {
		t.Fatalf("create the aggregate: %v %v", added, err)
	}
	if added, err := agg.EnsureAggregate(ctx, []string{"host-b", "host-a"}, 0); err != nil || len(added) != 1 || added[0] != "host-b" {
		t.Fatalf("extend the aggregate: %v %v", added, err)
	}
	made := time.Now()
	if hosts, err := f.AggregateSources(ctx); err != nil || strings.Join(hosts, ",") != "host-a,host-b" {
		t.Fatalf("sources %v %v", hosts, err)
	}

	all := awaitFleetRecords(t, f, 10)
	t.Logf("aggregate complete %v after it was made", time.Since(made).Round(time.Millisecond))
	next := map[string]uint64{}
	for _, r := range all {
		next[r.Host]++
		want := int(next[r.Host]) - 1
		if r.Host == "host-b" {
			want += 100
		}
		if r.HostSeq != next[r.Host] || string(r.Data) != fmt.Sprintf("event %d", want) || !strings.HasPrefix(r.Subject, r.Host+".nexus.events.") {
			t.Fatalf("aggregate record %+v (host seq want %d)", r, next[r.Host])
		}
	}
	if len(all) != 10 || next["host-a"] != 4 || next["host-b"] != 6 {
		t.Fatalf("aggregate: %d records, per host %v", len(all), next)
	}
	if got := fleetRecords(t, f, "host-b.>"); len(got) != 6 || got[0].Host != "host-b" {
		t.Fatalf("host-b's records: %d", len(got))
	}

	// Follow: an event appended on A arrives, with A's next sequence.
	fctx, fcancel := context.WithTimeout(ctx, testutil.Scale(30*time.Second))
	defer fcancel()
	got := make(chan Record, 1)
	go f.Scan(fctx, journal.Range{From: all[len(all)-1].Seq + 1, Follow: true}, func(r Record) error {
		got <- r
		return errStop
	})
	appendN(t, a, 4, 1)
	select {
	case r := <-got:
		if r.Host != "host-a" || r.HostSeq != 5 || string(r.Data) != "event 4" {
			t.Fatalf("followed %+v", r)
		}
	case <-fctx.Done():
		t.Fatal("a followed read saw nothing")
	}
	fcancel()

	// Nothing the reads made outlives them.
	s, err := f.js.Stream(ctx, AggregateStream)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(testutil.Scale(10 * time.Second)); ; {
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Consumers == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d consumers left on the aggregate", info.State.Consumers)
		}
		time.Sleep(250 * time.Millisecond)
	}
	cut := s.CachedInfo().Config
	cut.MaxMsgs = 10
	ajs := c.auditor(t, 0)
	refusedAll(t, map[string]func(context.Context) error{
		"the auditor cut the aggregate to 10 records":     func(c context.Context) error { _, err := f.js.UpdateStream(c, cut); return err },
		"the auditor deleted the aggregate":               func(c context.Context) error { return f.js.DeleteStream(c, AggregateStream) },
		"the auditor purged the aggregate":                func(c context.Context) error { return s.Purge(c) },
		"the auditor stepped the aggregate's leader down": func(c context.Context) error { return f.stepDown(c) },
		"the auditor deleted a mirror":                    func(c context.Context) error { return ajs.DeleteStream(c, mb.StreamName()) },
		"the auditor updated a mirror": func(c context.Context) error {
			_, err := ajs.UpdateStream(c, mirrorConfig(t, ajs, mb.StreamName()))
			return err
		},
		"the aggregator deleted the aggregate": func(c context.Context) error { return agg.js.DeleteStream(c, AggregateStream) },
		"the aggregator purged the aggregate": func(c context.Context) error {
			s, err := agg.js.Stream(c, AggregateStream)
			if err == nil {
				err = s.Purge(c)
			}
			return err
		},
	})
	if info, err := s.Info(ctx); err != nil || info.Config.MaxMsgs != -1 || info.Config.Duplicates != aggregateDuplicates || info.State.Msgs != 11 {
		t.Fatalf("the aggregate after the refusals: %+v, %v", info, err)
	}
	// The aggregator may step its leader down (KeepAggregate); what
	// follows holds across it.
	if err := agg.stepDown(ctx); err != nil {
		t.Fatalf("the aggregator's step-down: %v", err)
	}
	awaitLeader(t, f)

	// The operator deletes B's mirror (a repair), B makes it again, and
	// the aggregate goes on from what it held: the aggregator set its
	// resume points first.
	if _, err := agg.EnsureAggregate(ctx, []string{"host-a", "host-b"}, 0); err != nil {
		t.Fatal(err)
	}
	onc, err := nats.Connect(c.nodes[0].ClientURL(), nats.Timeout(testutil.Scale(30*time.Second)), nats.UserInfo("operator", fleetPass("operator")))
	if err != nil {
		t.Fatal(err)
	}
	defer onc.Close()
	ops, _ := jetstream.NewWithAPIPrefix(onc, OperatorAPIPrefix)
	if err := ops.DeleteStream(ctx, mb.StreamName()); err != nil {
		t.Fatalf("the operator deleted B's mirror: %v", err)
	}
	awaitAudited(t, ajs, mb.StreamName(), 6)
	appendN(t, b, 106, 2)
	all = awaitFleetRecords(t, f, 13)
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 13 {
		t.Fatalf("the aggregate after B's mirror was made again holds %+v (%v), want each of the 13 host records once", info.State, err)
	}
	// Read from a position, as --since does: the new events, no copies.
	from := all[10].Seq
	if got := awaitScan(t, f, from, 3); len(got) != 3 || got[0].HostSeq != 5 || got[1].HostSeq != 7 || got[2].HostSeq != 8 {
		t.Fatalf("from %d: %+v", from, got)
	}

	// A record stored by hand (a subject added to the aggregate) names
	// host-b but was never sourced from its mirror: reported and skipped.
	fnc, fjs := connectJS(t, c.nodes[1].ClientURL(), nats.UserInfo("forger", "forger"))
	defer fnc.Close()
	forged := s.CachedInfo().Config
	forged.Subjects = []string{"host-b.nexus.events.forged"}
	if _, err := fjs.UpdateStream(ctx, forged); err != nil {
		t.Fatal(err)
	}
	if _, err := fjs.Publish(ctx, "host-b.nexus.events.forged", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	appendN(t, b, 108, 1)
	all = awaitFleetRecords(t, f, 14)
	if last := all[13]; last.Host != "host-b" || last.HostSeq != 9 || len(rejected) == 0 ||
		rejected[0].Subject != "host-b.nexus.events.forged" || !strings.Contains(rejected[0].Reason, "no source") {
		t.Fatalf("after a forged record: last %+v, rejected %+v", last, rejected)
	}
}

// awaitFleetRecords waits until the aggregate yields n records, and
// returns them.
// awaitLeader waits until the aggregate answers its info with a leader.
func awaitLeader(t *testing.T, f *Auditor) {
	t.Helper()
	deadline := time.Now().Add(testutil.Scale(30 * time.Second))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := f.js.Stream(ctx, AggregateStream)
		cancel()
		if err == nil && s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Leader != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the aggregate has no leader (%v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func awaitFleetRecords(t *testing.T, f *Auditor, n int) []Record {
	t.Helper()
	return awaitScan(t, f, 1, n)
}

// awaitScan waits until a read of the aggregate from position from on
// yields n records, and returns them. A read that times out is tried
// again: while a source of the aggregate is being set up again, a read's
// first pull can go unanswered until its consumer is reset, which is not
// what this waits for.
func awaitScan(t *testing.T, f *Auditor, from uint64, n int) []Record {
	t.Helper()
	deadline := time.Now().Add(testutil.Scale(90 * time.Second))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(10*time.Second))
		var all []Record
		err := f.Scan(ctx, journal.Range{From: from}, func(r Record) error {
			all = append(all, r)
			return nil
		})
		cancel()
		if err == nil && len(all) >= n {
			return all
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the aggregate yields %d of %d records from %d (last error %v)", len(all), n, from, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHostAccountBounds: what a host's account holds it to, on one
// cluster with two hosts.
//
// The aggregate's deliveries from host A's account reach the auditors'
// account, so A's identity, linked as a leaf, may not publish there
// itself. A probe user added to the auditors' account sees what the
// import carries; a forged delivery never arrives (without the template's
// allow-list it does).
//
// The template's JetStream limits hold on their own, where a host's
// permissions would let it make streams: host X's user, allowed
// everything (the template edited), makes its two streams and no third,
// and none larger than its account's storage.
func TestHostAccountBounds(t *testing.T) {
	const auditUsers = `users: [`
	c := startTemplateFleet(t, []string{"host-a", "host-x"}, func(tmpl string) string {
		i := strings.Index(tmpl, AuditAccount+": {")
		perm := "permissions: { publish: { allow: " + list(hostAllowed("host-x", fleetDomain)) + " } }"
		if i < 0 || !strings.Contains(tmpl[i:], auditUsers) || !strings.Contains(tmpl, perm) {
			t.Fatalf("template changed shape:\n%s", tmpl)
		}
		tmpl = tmpl[:i] + strings.Replace(tmpl[i:], auditUsers, auditUsers+`{ user: "probe", password: "probe" },`, 1)
		return strings.Replace(tmpl, perm, `permissions: { publish: { allow: [">"] } }`, 1)
	})

	probe, err := nats.Connect(c.nodes[0].ClientURL(), nats.Timeout(testutil.Scale(30*time.Second)), nats.UserInfo("probe", "probe"))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	got, err := probe.SubscribeSync(aggregateDeliver("host-a") + ".>")
	if err != nil {
		t.Fatal(err)
	}
	probe.Flush()

	anc := c.attacker(t, "host-a")
	// The interest of the probe crosses to the leaf only once the hub
	// has sent it; publish until the window for it has passed.
	for i := 0; i < 20; i++ {
		anc.Publish(aggregateDeliver("host-a")+".forged", []byte("forged"))
		anc.Flush()
		time.Sleep(100 * time.Millisecond)
	}
	if m, err := got.NextMsg(time.Second); err == nil {
		t.Fatalf("a forged delivery reached the auditors' account: %s %q", m.Subject, m.Data)
	}
	fjs, _ := jetstream.NewWithDomain(c.attacker(t, "host-x"), fleetDomain)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(30*time.Second))
	defer cancel()
	mk := func(name string, maxBytes int64) error {
		_, err := fjs.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name)}, Replicas: 1, MaxBytes: maxBytes})
		return err
	}
	var api *jetstream.APIError
	if err := mk("TOO-BIG", 2*testMaxBytes); !errors.As(err, &api) || !refusedAccount(err) {
		t.Fatalf("a stream larger than the account's storage: %v", err)
	}
	for _, name := range []string{"ONE", "TWO"} {
		if err := mk(name, 1<<20); err != nil {
			t.Fatalf("stream %s within the limits: %v", name, err)
		}
	}
	if err := mk("THREE", 1<<20); !errors.As(err, &api) || api.ErrorCode != 10027 {
		t.Fatalf("a third stream past the account's limit of %d: %v", hostStreams, err)
	}
}
