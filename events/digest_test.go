package events

import "testing"

// A chain's digest depends on every record's sequence and bytes, in order.
func TestChain(t *testing.T) {
	sum := func(recs ...struct {
		seq  uint64
		data string
	}) string {
		var c Chain
		for _, r := range recs {
			c.Add(r.seq, []byte(r.data))
		}
		return c.Digest()
	}
	type rec = struct {
		seq  uint64
		data string
	}
	base := sum(rec{1, "a"}, rec{2, "b"})
	if base != sum(rec{1, "a"}, rec{2, "b"}) {
		t.Fatal("the same records hash to two digests")
	}
	for name, other := range map[string]string{
		"changed bytes":   sum(rec{1, "a"}, rec{2, "c"}),
		"other sequence":  sum(rec{1, "a"}, rec{3, "b"}),
		"swapped":         sum(rec{1, "b"}, rec{2, "a"}),
		"one more":        sum(rec{1, "a"}, rec{2, "b"}, rec{3, ""}),
		"bytes moved":     sum(rec{1, "ab"}, rec{2, ""}),
		"first left out":  sum(rec{2, "b"}),
		"nothing at all":  sum(),
		"last left out":   sum(rec{1, "a"}),
		"empty bytes too": sum(rec{1, "a"}, rec{2, "b"}, rec{3, ""}, rec{4, ""}),
	} {
		if other == base {
			t.Errorf("%s: same digest as the records", name)
		}
	}
}
