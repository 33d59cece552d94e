package replay

import "hash/maphash"

// idSet remembers message ids and the sequence that first carried each. A
// journal's million ids as Go strings in a map are a million pointers for
// the collector to trace on every cycle while verify runs; here the ids
// live in one byte arena and the map holds only integers, which it never
// scans. Lookups are exact: a hash match is confirmed against the arena,
// and ids whose hashes collide are chained through idRef.next.
type idSet struct {
	seed   maphash.Seed
	byHash map[uint64]uint32 // hash → 1 + index of the newest id with it
	ids    []idRef
	arena  []byte
}

type idRef struct {
	off, n uint32
	next   uint32 // 1 + index of an older id with the same hash, or 0
	seq    uint64
}

func newIDSet() idSet {
	return idSet{seed: maphash.MakeSeed(), byHash: map[uint64]uint32{}}
}

// add records id at seq, or returns the sequence that carried it first.
func (s *idSet) add(id string, seq uint64) (first uint64, dup bool) {
	h := maphash.String(s.seed, id)
	head := s.byHash[h]
	for i := head; i != 0; i = s.ids[i-1].next {
		ref := s.ids[i-1]
		if string(s.arena[ref.off:ref.off+ref.n]) == id {
			return ref.seq, true
		}
	}
	s.ids = append(s.ids, idRef{off: uint32(len(s.arena)), n: uint32(len(id)), next: head, seq: seq})
	s.byHash[h] = uint32(len(s.ids))
	s.arena = append(s.arena, id...)
	return 0, false
}
