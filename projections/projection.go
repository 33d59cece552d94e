// Package projections folds journal events into the views nexus decides
// from: sandboxes, resource ownership, open sagas. Every fold is pure:
// events in, value out, no I/O. Snapshots are bytes; storing them is the
// caller's business.
package projections

import (
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/events"
)

// Projection is a fold over the journal that can be snapshotted.
type Projection interface {
	// Name identifies the projection's snapshot.
	Name() string
	// Apply folds the event stored at seq. Sequences arrive in order.
	Apply(seq uint64, e events.Event)
	// Seq is the sequence of the last event applied (0 if none).
	Seq() uint64
	// MarshalState encodes the state deterministically.
	MarshalState() ([]byte, error)
	// UnmarshalState replaces the state with a decoded one at seq.
	UnmarshalState(seq uint64, data []byte) error
}

// SnapshotFormat is the version of the snapshot container.
// Format 2: sandboxes and volumes carry Rev, so a format-1 snapshot is
// rebuilt from the journal rather than read with every Rev at zero.
// Format 3: a reclaimed snapshot directory leaves its sandbox's Snapshots
// (snapshot rm), so older snapshots are rebuilt rather than trusted.
// Format 4: a sandbox carries the cache entry it came from (Bootstrap),
// which the image cache no longer keeps per sandbox.
const SnapshotFormat = 4

// ErrBadSnapshot means a snapshot cannot be used; the caller rebuilds the
// projection from the start of the journal instead.
var ErrBadSnapshot = errors.New("unusable projection snapshot")

type snapshotFile struct {
	Format  uint8  `msgpack:"f"`
	Name    string `msgpack:"n"`
	Seq     uint64 `msgpack:"s"`
	EventID []byte `msgpack:"e"` // id of the event at Seq, to detect a replaced journal
	State   []byte `msgpack:"st"`
	CRC     uint32 `msgpack:"c"`
}

// Snapshot is a decoded snapshot header: which event it covers up to.
type Snapshot struct {
	Seq     uint64
	EventID ulid.ULID
}

// EncodeSnapshot captures p after the event lastID (at p.Seq()).
func EncodeSnapshot(p Projection, lastID ulid.ULID) ([]byte, error) {
	state, err := p.MarshalState()
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", p.Name(), err)
	}
	return msgpack.Marshal(&snapshotFile{
		Format: SnapshotFormat, Name: p.Name(), Seq: p.Seq(), EventID: lastID[:],
		State: state, CRC: crc32.ChecksumIEEE(state),
	})
}

// DecodeSnapshot loads data into p. Any damage, a name mismatch or a newer
// format returns ErrBadSnapshot and leaves p as it was.
func DecodeSnapshot(data []byte, p Projection) (Snapshot, error) {
	var f snapshotFile
	if err := events.StrictUnmarshal(data, &f); err != nil {
		return Snapshot{}, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	switch {
	case f.Format != SnapshotFormat:
		return Snapshot{}, fmt.Errorf("%w: format %d", ErrBadSnapshot, f.Format)
	case f.Name != p.Name():
		return Snapshot{}, fmt.Errorf("%w: snapshot of %q, not %q", ErrBadSnapshot, f.Name, p.Name())
	case crc32.ChecksumIEEE(f.State) != f.CRC:
		return Snapshot{}, fmt.Errorf("%w: checksum mismatch", ErrBadSnapshot)
	case len(f.EventID) != len(ulid.ULID{}):
		return Snapshot{}, fmt.Errorf("%w: event id of %d bytes", ErrBadSnapshot, len(f.EventID))
	}
	if err := p.UnmarshalState(f.Seq, f.State); err != nil {
		return Snapshot{}, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	var id ulid.ULID
	copy(id[:], f.EventID)
	return Snapshot{Seq: f.Seq, EventID: id}, nil
}
