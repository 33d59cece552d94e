package fleet

import (
	"slices"
	"testing"
)

func TestStalledSources(t *testing.T) {
	for _, tc := range []struct {
		name string
		prev map[string]uint64
		cur  []sourceView
		want []string
	}{
		{"silent, behind, held still", map[string]uint64{"a": 5}, []sourceView{{host: "a", silent: true, held: 5, mirror: 9}}, []string{"a"}},
		{"never heard, nothing held", map[string]uint64{"a": 0}, []sourceView{{host: "a", silent: true, mirror: 9}}, []string{"a"}},
		{"first look: no pass before", map[string]uint64{}, []sourceView{{host: "a", silent: true, held: 5, mirror: 9}}, nil},
		{"moved since the pass before", map[string]uint64{"a": 4}, []sourceView{{host: "a", silent: true, held: 5, mirror: 9}}, nil},
		{"hears its mirror", map[string]uint64{"a": 5}, []sourceView{{host: "a", held: 5, mirror: 9}}, nil},
		{"current", map[string]uint64{"a": 9}, []sourceView{{host: "a", silent: true, held: 9, mirror: 9}}, nil},
		{"mirror re-created, behind the aggregate", map[string]uint64{"a": 9}, []sourceView{{host: "a", silent: true, held: 9, mirror: 3}}, nil},
		{"mirror not answering", map[string]uint64{"a": 5}, []sourceView{{host: "a", silent: true, held: 5}}, nil},
		{"only the stalled of several", map[string]uint64{"a": 5, "b": 1, "c": 2}, []sourceView{
			{host: "c", silent: true, held: 2, mirror: 7},
			{host: "a", held: 5, mirror: 9},
			{host: "b", silent: true, held: 1, mirror: 7},
		}, []string{"b", "c"}},
	} {
		if got := stalled(tc.prev, tc.cur); !slices.Equal(got, tc.want) {
			t.Errorf("%s: stalled %v, want %v", tc.name, got, tc.want)
		}
	}
}
