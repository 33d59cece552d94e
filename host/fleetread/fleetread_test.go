package fleetread

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// A host's record stored twice in the aggregate (sourcing is at least
// once) is yielded once; other hosts' records pass.
func TestHostSeqsYieldEachHostRecordOnce(t *testing.T) {
	in := []struct {
		host string
		seq  uint64
	}{{"a", 1}, {"b", 1}, {"a", 2}, {"b", 1}, {"b", 2}, {"a", 2}, {"a", 3}}
	seen := hostSeqs{}
	var got []string
	for _, r := range in {
		if seen.fresh(r.host, r.seq) {
			got = append(got, fmt.Sprintf("%s%d", r.host, r.seq))
		}
	}
	if want := []string{"a1", "b1", "a2", "b2", "a3"}; !slices.Equal(got, want) {
		t.Fatalf("yielded %v, want %v", got, want)
	}
}

// An aggregate record is its host's only when its source header names
// that host's mirror, a host sequence, and the subject it is stored under.
func TestCheckSource(t *testing.T) {
	const subj = "host-b.nexus.events.sandbox.created.s1"
	shared := sourceCheck{}
	for _, c := range []struct {
		subject, header string
		seq             uint64 // 0: rejected
		reason          string
	}{
		{subj, "NEXUS_HOST_B:Xyz12 7 > > " + subj + " ident1", 7, ""},
		{subj, "NEXUS_HOST_B 7 > > " + subj, 7, ""},
		{subj, " NEXUS_HOST_B  7 >\t>  " + subj, 7, ""},
		{subj, "", 0, "no source"},
		// Host A's record relabelled as B's by a subject transform.
		{subj, "NEXUS_HOST_A:Xyz12 7 > > host-a.nexus.events.sandbox.created.s1", 0, "subject names host host-b"},
		{subj, "NEXUS_HOST_B:Xyz12 7 > > host-b.nexus.events.other", 0, "holds it as"},
		{subj, "NEXUS_HOST_B:Xyz12 0 > > " + subj, 0, "no host sequence"},
		{subj, "NEXUS_HOST_B:Xyz12 x > > " + subj, 0, "no host sequence"},
		{subj, "NEXUS_HOST_B 7", 0, "malformed"},
		{"Host_B.nexus.events.x", "NEXUS_HOST_B 7 > > Host_B.nexus.events.x", 0, "names no host"},
	} {
		// Alone, and twice through one read's check, which remembers
		// the hosts it met.
		for _, check := range []func(string, string) (Source, error){CheckSource, shared.check, shared.check} {
			src, err := check(c.subject, c.header)
			switch {
			case c.seq != 0 && (err != nil || src.Seq != c.seq || src.Host != "host-b"):
				t.Errorf("%q: %+v, %v; want host-b %d", c.header, src, err, c.seq)
			case c.seq == 0 && (err == nil || !strings.Contains(err.Error(), c.reason)):
				t.Errorf("%q on %s: %v; want a refusal saying %q", c.header, c.subject, err, c.reason)
			}
		}
	}
}
