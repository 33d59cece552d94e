package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// fleetRecords scans the whole aggregate (or what filters select).
func fleetRecords(t *testing.T, f *Auditor, filters ...string) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
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

// TestFleetAggregate: on a real three-node fleet under the template, the
// auditor creates the aggregate from two hosts' mirrors (extending it
// adds, never drops), and reads every host's records with its host and
// its sequence in that host's journal, filtered by host on the server,
// followed live, leaving no consumer behind; it still cannot delete the
// aggregate or a mirror.
func TestFleetAggregate(t *testing.T) {
	c := startTemplateFleet(t, []string{"host-a", "host-b"}, nil)
	js, ms := c.openHosts(t, 0)
	a, b, mb := js[0], js[1], ms[1]
	appendN(t, a, 0, 4)
	appendN(t, b, 100, 6)

	url := c.auditorURL(1)
	f, err := Dial(url, "")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := f.Scan(ctx, journal.Range{}, func(Record) error { return nil }); err == nil || !strings.Contains(err.Error(), "nexus fleet aggregate") {
		t.Fatalf("a read before the aggregate exists: %v", err)
	}
	if added, err := f.EnsureAggregate(ctx, []string{"host-a"}, 0); err != nil || len(added) != 1 {
		t.Fatalf("create the aggregate: %v %v", added, err)
	}
	if added, err := f.EnsureAggregate(ctx, []string{"host-b", "host-a"}, 0); err != nil || len(added) != 1 || added[0] != "host-b" {
		t.Fatalf("extend the aggregate: %v %v", added, err)
	}
	made := time.Now()
	if hosts, err := f.AggregateSources(ctx); err != nil || strings.Join(hosts, ",") != "host-a,host-b" {
		t.Fatalf("sources %v %v", hosts, err)
	}

	var all []Record
	for all = fleetRecords(t, f); len(all) < 10; all = fleetRecords(t, f) {
		if ctx.Err() != nil {
			t.Fatalf("the aggregate holds %d of 10 records", len(all))
		}
		time.Sleep(200 * time.Millisecond)
	}
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
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
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
	for deadline := time.Now().Add(10 * time.Second); ; {
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
	// A refused request goes unanswered: each waits 3 s at most.
	refused := func(what string, do func(context.Context) error) {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		defer rcancel()
		if err := do(rctx); err == nil {
			t.Fatalf("the auditor %s", what)
		}
	}
	refused("deleted the aggregate", func(c context.Context) error { return f.js.DeleteStream(c, AggregateStream) })
	refused("purged the aggregate", func(c context.Context) error { return s.Purge(c) })
	refused("deleted a mirror", func(c context.Context) error { return f.js.DeleteStream(c, mb.StreamName()) })
}

// TestHostCannotForgeItsAggregateDeliveries: the aggregate's deliveries
// from host A's account reach the auditors' account, so A's identity,
// linked as a leaf, may not publish there itself. A probe user added to
// the auditors' account sees what the import carries; a forged delivery
// never arrives (without the template's deny it does).
func TestHostCannotForgeItsAggregateDeliveries(t *testing.T) {
	const auditUsers = `users: [{ user: "auditor"`
	c := startTemplateFleet(t, []string{"host-a"}, func(tmpl string) string {
		if !strings.Contains(tmpl, auditUsers) {
			t.Fatalf("template changed shape:\n%s", tmpl)
		}
		return strings.Replace(tmpl, auditUsers, `users: [{ user: "probe", password: "probe" }, { user: "auditor"`, 1)
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
}
