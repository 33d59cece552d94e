package events

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// JournalDigestEvent: the journal's running digest (Chain) over every
// record up to and including sequence Seq, which comes before this event.
// A copy of the journal (the fleet's mirror) that holds other bytes at any
// of those sequences hashes to another digest.
type JournalDigestEvent struct {
	Seq    uint64 `msgpack:"seq" json:"seq"`
	Digest string `msgpack:"digest" json:"digest"` // hex SHA-256
}

func (JournalDigestEvent) EventType() Type { return JournalDigest }

// Chain is a running SHA-256 over a journal's records in sequence order:
// each step hashes the previous sum, the record's sequence (8 bytes, big
// endian) and its stored bytes, so one changed, missing, moved or added
// record changes every later sum. The zero Chain is the journal before its
// first record.
type Chain struct {
	// Seq is the last sequence added (0: none).
	Seq uint64
	sum [sha256.Size]byte
}

// Add takes the record at seq with its stored bytes data.
func (c *Chain) Add(seq uint64, data []byte) {
	h := sha256.New()
	h.Write(c.sum[:])
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	h.Write(b[:])
	h.Write(data)
	h.Sum(c.sum[:0])
	c.Seq = seq
}

// Digest is the chain's sum in hex, as journal.digest carries it.
func (c *Chain) Digest() string { return hex.EncodeToString(c.sum[:]) }
