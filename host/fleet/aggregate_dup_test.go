package fleet

import (
	"fmt"
	"slices"
	"testing"
)

// A host's record stored twice in the aggregate (sourcing is at least
// once) is yielded once; other hosts' records and records without a host
// sequence pass.
func TestHostSeqsYieldEachHostRecordOnce(t *testing.T) {
	in := []struct {
		host string
		seq  uint64
	}{{"a", 1}, {"b", 1}, {"a", 2}, {"b", 1}, {"b", 2}, {"a", 2}, {"x", 0}, {"x", 0}, {"a", 3}}
	seen := hostSeqs{}
	var got []string
	for _, r := range in {
		if seen.fresh(r.host, r.seq) {
			got = append(got, fmt.Sprintf("%s%d", r.host, r.seq))
		}
	}
	if want := []string{"a1", "b1", "a2", "b2", "x0", "x0", "a3"}; !slices.Equal(got, want) {
		t.Fatalf("yielded %v, want %v", got, want)
	}
}
