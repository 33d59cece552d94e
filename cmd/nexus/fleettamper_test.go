package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// checkNames are the names of the checks st failed.
func checkNames(st fleet.MirrorState) []string {
	var out []string
	for _, f := range st.FailedChecks {
		out = append(out, f.Check)
	}
	return out
}

// TestFleetStatusFailsATamperedMirror: on a real three-node cluster
// configured from the template, the template's operator cuts a host's
// mirror down to its last record (an update of its limits, which the
// operator may make). `fleet status` then exits 1 naming the failed
// checks in one line on stderr, --json still prints the state with them,
// and an auditor's `replay verify --nats` refuses the mirror naming the
// same check; before the cut both pass.
func TestFleetStatusFailsATamperedMirror(t *testing.T) {
	testutil.StartsSandboxes(t)
	passes := map[string]string{"host-a": "pass-a", "auditor": "pass-audit", "aggregator": "pass-agg", "operator": "pass-op"}
	for user, p := range passes {
		t.Setenv(fleet.PasswordVar(user), p)
	}
	tmpl := mustOK(t, nexus(t, t.TempDir(), "fleet", "template", "--host", "host-a"), "template").stdout
	clientURL, leaf := startTemplateCluster(t, tmpl)
	root := shortRoot(t)
	var urls []string
	for _, p := range leaf {
		urls = append(urls, fmt.Sprintf("nats-leaf://host-a:pass-a@127.0.0.1:%d", p))
	}
	d := mirroringDaemon(t, root, "host-a", strings.Join(urls, ","), "NEXUS_FLEET_DIGEST_INTERVAL=200ms")
	d.WaitLog(t, 2*time.Minute, "mirror.created")

	// The daemon's own events (the mirror's creation and link, the
	// digest) are enough records to cut.
	st := fleetStatus(t, root, func(s fleet.MirrorState) bool {
		return s.Connected && s.Exists && s.MirrorLastSeq >= 3 && s.MirrorLastSeq == s.JournalLastSeq && s.DigestSeq > 0 && s.ReportedSeq >= s.DigestSeq
	})
	if len(st.FailedChecks) != 0 {
		t.Fatalf("a true mirror failed %v", st.FailedChecks)
	}
	auditorURL := strings.Replace(clientURL, "nats://", "nats://auditor:pass-audit@", 1)
	verify := func() result {
		return nexus(t, t.TempDir(), "replay", "verify", "--nats", auditorURL, "--stream", st.Stream, "--nats-api-prefix", fleet.AuditAPIPrefix)
	}
	mustOK(t, verify(), "an auditor's replay verify of a true mirror")

	nc, err := nats.Connect(strings.Replace(clientURL, "nats://", "nats://operator:pass-op@", 1), nats.Timeout(testutil.Scale(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	defer cancel()
	reads, _ := jetstream.NewWithAPIPrefix(nc, fleet.AuditAPIPrefix)
	repairs, _ := jetstream.NewWithAPIPrefix(nc, fleet.OperatorAPIPrefix)
	s, err := reads.Stream(ctx, st.Stream)
	if err != nil {
		t.Fatalf("the operator reads the mirror: %v", err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = 1
	if _, err := repairs.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("the operator limits the mirror: %v", err)
	}

	st = fleetStatus(t, root, func(s fleet.MirrorState) bool { return slices.Contains(checkNames(s), fleet.CheckFirstSeq) })
	if got := checkNames(st); !slices.Contains(got, fleet.CheckCount) || st.MirrorMsgs != 1 {
		t.Fatalf("a mirror cut to its last record failed %v, want first_seq and count (%+v)", got, st)
	}
	r := nexus(t, root, "fleet", "status", "--json")
	wantFailure(t, r, 1, "first_seq check failed")
	if !strings.Contains(r.stderr, "count check failed") || !strings.Contains(r.stderr, st.Stream) {
		t.Fatalf("fleet status --json stderr %q names neither the count check nor the stream", r.stderr)
	}
	var printed fleet.MirrorState
	if err := json.Unmarshal([]byte(r.stdout), &printed); err != nil || len(printed.FailedChecks) == 0 {
		t.Fatalf("fleet status --json of a failing mirror printed %q (%v)", r.stdout, err)
	}
	r = nexus(t, root, "fleet", "status")
	wantFailure(t, r, 1, "first_seq check failed")
	if !strings.Contains(r.stdout, "FAILED") {
		t.Fatalf("fleet status text of a failing mirror: %q", r.stdout)
	}
	wantFailure(t, verify(), 1, "first_seq check failed")
}
