package projections

import (
	"slices"
	"testing"
)

func TestIDsNamedBy(t *testing.T) {
	refs := []Ref{{ID: "01M92E0000000000000000000A", Handle: "web"}, {ID: "01M92E0000000000000000000B"}, {ID: "01M93X0000000000000000000C"}}
	for _, c := range []struct {
		ref  string
		want []string
	}{
		{"01M92E", []string{refs[0].ID, refs[1].ID}},
		{"01m93x", []string{refs[2].ID}},
		{"01M9", []string{refs[0].ID, refs[1].ID, refs[2].ID}},
		{"01M", nil},      // shorter than MinPrefix: Match never reads it as a prefix
		{"web", nil},      // a handle, not an ID prefix
		{"01M92E-x", nil}, // '-' is in no ULID
		{"01M92I", nil},   // neither is I
		{"01M92F", nil},   // the alphabet, but no ID begins so
		{refs[1].ID, []string{refs[1].ID}},
		{"128A04", []string{refs[1].ID}}, // a prefix of its short ID, 128a04b7acd2
		{"1c79be038922", []string{refs[2].ID}},
	} {
		if got := IDsNamedBy(refs, c.ref); !slices.Equal(got, c.want) {
			t.Errorf("IDsNamedBy(%q) = %v, want %v", c.ref, got, c.want)
		}
	}
}
