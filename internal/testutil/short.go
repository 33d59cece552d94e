package testutil

import "testing"

// SkipInShort skips t under -short (make test-fast): a test whose cost is
// its scale or its waits (a cluster, heartbeats, tens of thousands of
// appends). why names that cost; make test runs it.
func SkipInShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip(why + "; make test runs it, -short does not")
	}
}

// ShortSample skips t under -short unless keep: a table that walks every
// step, state or format of one rule runs the cases marked keep in make
// test-fast and every case in make test, so the edit-test loop still
// crosses each branch of the rule once.
func ShortSample(t testing.TB, keep bool) {
	t.Helper()
	if testing.Short() && !keep {
		t.Skip("-short runs a sample of this table; make test runs every case")
	}
}
