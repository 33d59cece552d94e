package projections

import "testing"

// FuzzUnmarshalState: a snapshot's state bytes (the CRC checked, but a
// snapshot written by a buggy or future nexus can still be wrong) either
// load or fail; loading never panics. A failed load makes the store rebuild the
// projection from the journal.
func FuzzUnmarshalState(f *testing.F) {
	f.Add([]byte{0x90})
	f.Add([]byte{0x80})
	f.Add([]byte{0xc0})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, p := range []Projection{NewSandboxes(), NewSagas(), NewVolumes()} {
			_ = p.UnmarshalState(1, data)
		}
	})
}
