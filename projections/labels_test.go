package projections

import (
	"strings"
	"testing"
)

func TestParseLabels(t *testing.T) {
	for _, c := range []struct {
		flags []string
		want  map[string]string
		err   string
	}{
		{flags: nil, want: nil},
		{flags: []string{"team=web", "tier=", "url=http://x/?a=b", "app.kubernetes.io/name=api"},
			want: map[string]string{"team": "web", "tier": "", "url": "http://x/?a=b", "app.kubernetes.io/name": "api"}},
		{flags: []string{"team"}, err: `label "team": want KEY=VALUE`},
		{flags: []string{"=web"}, err: `label "=web": the key is`},
		{flags: []string{"-x=1"}, err: `label "-x=1": the key is`},
		{flags: []string{"a b=1"}, err: `the key is`},
		{flags: []string{"k=a\nb"}, err: "control character"},
		{flags: []string{"k=" + strings.Repeat("v", MaxLabelValue+1)}, err: "longer than"},
		{flags: []string{strings.Repeat("k", MaxLabelKey+1) + "=v"}, err: "the key is"},
		{flags: []string{"k=1", "k=2"}, err: `label "k" given twice`},
	} {
		got, err := ParseLabels(c.flags)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%q: err %v, want one line with %q", c.flags, err, c.err)
			}
			continue
		}
		if err != nil || len(got) != len(c.want) {
			t.Errorf("%q: %v, %v", c.flags, got, err)
			continue
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Errorf("%q: %s=%q, want %q", c.flags, k, got[k], v)
			}
		}
	}
	many := make([]string, MaxLabels+1)
	for i := range many {
		many[i] = "k" + strings.Repeat("x", i) + "=v"
	}
	if _, err := ParseLabels(many); err == nil {
		t.Errorf("%d labels accepted", len(many))
	}
}
