package fleet

import "testing"

// skipInShort skips, under -short (make test-fast), a test that spends
// tens of seconds waiting on a fleet cluster, a leaf link or heartbeats on
// a loaded machine; make test runs it. why names what it waits for.
func skipInShort(t *testing.T, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip(why + "; make test runs it, -short does not")
	}
}
