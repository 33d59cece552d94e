package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/lease"
)

// ErrNotRepairable means the journal's damage is not a torn tail that
// cutting can repair without dropping a whole record.
var ErrNotRepairable = errors.New("journal damage is not a torn tail")

// ErrBackupNotEmpty means the backup directory given to Repair already
// holds something.
var ErrBackupNotEmpty = errors.New("backup directory is not empty")

// RepairReport says what Repair cut, exactly.
type RepairReport struct {
	Dir    string `json:"dir"`              // the journal directory
	Whole  bool   `json:"whole"`            // nothing was damaged; nothing was touched
	Backup string `json:"backup,omitempty"` // where the store was copied before the cut
	Block  string `json:"block,omitempty"`  // the block file that was cut
	Reason string `json:"reason,omitempty"` // what the verifier found at Offset
	// Offset is where the block now ends: the end of its last whole record.
	Offset   int64 `json:"offset"`
	CutBytes int64 `json:"cut_bytes"`
	// LastGoodSeq is the last whole record's sequence (0: none is left).
	LastGoodSeq uint64 `json:"last_good_seq"`
	// FirstLostSeq is the sequence of the torn record, when its header
	// survived to say so; 0 when it is not knowable.
	FirstLostSeq uint64 `json:"first_lost_seq,omitempty"`
	// Removed lists derived files deleted so the server rebuilds its state
	// from the blocks (they are in the backup).
	Removed []string `json:"removed"`
}

// seqFlags are the high bits the filestore sets on a record's sequence
// (ebit: erased, tbit: tombstone); see server/filestore.go.
const (
	seqErased    = uint64(1) << 63
	seqTombstone = uint64(1) << 62
)

// Repair cuts a torn tail off the journal in dir: only when the first
// damage the block verifier finds is in the last block and nothing whole
// follows it (a record running past the end of the file, a final record
// whose checksum fails, or a zero-filled tail). Before cutting it copies
// the store to backup, which must not exist or be empty, and syncs the
// copy. It takes the journal's lock, so it refuses while a daemon or a
// command has the store open. A whole journal is left untouched.
// Repair is never run on nexus's own initiative.
func Repair(dir, backup string) (RepairReport, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return RepairReport{}, err
	}
	rep := RepairReport{Dir: dir}
	if fi, err := fsx.Stat(dir, formatFile); err != nil || !fi.Mode().IsRegular() {
		return rep, fmt.Errorf("%w: %s has no %s", ErrNoJournal, dir, formatFile)
	}
	if err := checkFormat(dir); err != nil {
		return rep, err
	}
	l, err := lease.TryAcquire(filepath.Join(dir, lockFile))
	if errors.Is(err, lease.ErrHeld) {
		return rep, fmt.Errorf("%w: %v (stop the daemon first)", ErrLocked, err)
	}
	if err != nil {
		return rep, fmt.Errorf("journal %s: %w", dir, err)
	}
	defer l.Release()

	msgs := filepath.Join(dir, "jetstream", account, "streams", StreamName, "msgs")
	verr := VerifyStreamBlocks(msgs, StreamName)
	if verr == nil {
		rep.Whole = true
		return rep, nil
	}
	var ce *CorruptError
	if !errors.As(verr, &ce) {
		return rep, verr
	}
	rep.Block, rep.Reason = ce.File, ce.Reason
	if last, err := lastBlock(msgs); err != nil {
		return rep, err
	} else if last != ce.File {
		return rep, fmt.Errorf("%w: %v, and %s follows it; cutting would drop whole records", ErrNotRepairable, ce, filepath.Base(last))
	}
	buf, err := fsx.ReadFile(dir, ce.File) // a link or FIFO there is refused, never followed or blocked on
	if err != nil {
		return rep, fmt.Errorf("journal: read block: %w", err)
	}
	rep.Offset, rep.CutBytes = ce.Offset, int64(len(buf))-ce.Offset
	rep.LastGoodSeq = lastSeq(buf[:ce.Offset])
	if rep.LastGoodSeq == 0 {
		if rep.LastGoodSeq, err = lastSeqBefore(msgs, ce.File); err != nil {
			return rep, err
		}
	}
	if torn, err := tornTail(ce.File, buf, ce.Offset, rep.LastGoodSeq); err != nil {
		return rep, err
	} else if !torn {
		return rep, fmt.Errorf("%w: %v, and whole records follow it; cutting would drop them", ErrNotRepairable, ce)
	}
	if tail := buf[ce.Offset:]; len(tail) >= 12 {
		if seq := binary.LittleEndian.Uint64(tail[4:12]) &^ (seqErased | seqTombstone); seq == rep.LastGoodSeq+1 {
			rep.FirstLostSeq = seq
		}
	}

	if err := prepareBackup(backup); err != nil {
		return rep, err
	}
	if rep.Backup, err = filepath.Abs(backup); err != nil {
		return rep, err
	}
	if err := copyTree(dir, rep.Backup); err != nil {
		return rep, fmt.Errorf("journal: back up %s to %s: %w", dir, rep.Backup, err)
	}
	if err := syncTree(rep.Backup); err != nil {
		return rep, fmt.Errorf("journal: sync the backup %s: %w", rep.Backup, err)
	}

	if err := cutBlock(dir, ce.File, ce.Offset); err != nil {
		return rep, err
	}
	// The server's saved stream state (server/filestore.go,
	// streamStreamStateFile) may count the torn record; without it the
	// server rebuilds the state from the blocks on the next open.
	stateFile := filepath.Join(msgs, "index.db")
	if err := os.Remove(stateFile); err == nil {
		rep.Removed = append(rep.Removed, stateFile)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return rep, fmt.Errorf("journal: %w", err)
	}
	if err := syncDir(msgs); err != nil {
		return rep, err
	}
	if err := VerifyStreamBlocks(msgs, StreamName); err != nil {
		return rep, fmt.Errorf("journal: still damaged after the cut (the backup in %s is untouched): %w", rep.Backup, err)
	}
	return rep, nil
}

// tornTail reports whether the damage at off is the end of the block:
// no whole record starts anywhere after it. A record torn by a crash or a
// failed write, or a zero-filled tail, qualifies; a flipped bit in a record
// with whole records behind it does not. Candidates are found by their
// header (sane length, a sequence past the last good one) before their
// checksum is computed.
func tornTail(path string, buf []byte, off int64, lastGood uint64) (bool, error) {
	idx, ok := parseIndex(filepath.Base(path), blockSuffix)
	if !ok {
		return false, fmt.Errorf("journal: %s is not a block file", path)
	}
	hh, err := blockHash(idx, StreamName)
	if err != nil {
		return false, err
	}
	le := binary.LittleEndian
	for p := int(off) + 1; p+minRecordLen <= len(buf); p++ {
		rl := int64(le.Uint32(buf[p:]) &^ headersBit)
		if rl < minRecordLen || rl > int64(len(buf)-p) {
			continue
		}
		if seq := le.Uint64(buf[p+4:]) &^ (seqErased | seqTombstone); seq <= lastGood {
			continue
		}
		if _, reason := checkRecord(buf, p, hh); reason == "" {
			return false, nil
		}
	}
	return true, nil
}

// lastSeq is the sequence of the last record in buf, which holds whole,
// verified records only (0 if none).
func lastSeq(buf []byte) uint64 {
	var seq uint64
	for off := 0; off+recordHeaderLen <= len(buf); {
		rl := int(binary.LittleEndian.Uint32(buf[off:]) &^ headersBit)
		if rl < minRecordLen {
			break
		}
		if s := binary.LittleEndian.Uint64(buf[off+4:]); s&seqTombstone == 0 {
			seq = s &^ seqErased
		}
		off += rl
	}
	return seq
}

// lastSeqBefore is the last sequence in the blocks before the one named
// last (all verified whole).
func lastSeqBefore(msgs, last string) (uint64, error) {
	blocks, err := blockFiles(msgs)
	if err != nil {
		return 0, err
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		if blocks[i] == last {
			continue
		}
		buf, err := fsx.ReadFile(msgs, blocks[i])
		if err != nil {
			return 0, fmt.Errorf("journal: read block: %w", err)
		}
		if seq := lastSeq(buf); seq != 0 {
			return seq, nil
		}
	}
	return 0, nil
}

func lastBlock(msgs string) (string, error) {
	blocks, err := blockFiles(msgs)
	if err != nil || len(blocks) == 0 {
		return "", err
	}
	return blocks[len(blocks)-1], nil
}

// blockFiles lists msgs' block files in stream order.
func blockFiles(msgs string) ([]string, error) {
	entries, err := os.ReadDir(msgs)
	if err != nil {
		return nil, fmt.Errorf("journal: list msgs dir: %w", err)
	}
	type block struct {
		index uint32
		path  string
	}
	var blocks []block
	for _, e := range entries {
		if idx, ok := parseIndex(e.Name(), blockSuffix); ok {
			blocks = append(blocks, block{idx, filepath.Join(msgs, e.Name())})
		}
	}
	slices.SortFunc(blocks, func(a, b block) int { return int(int64(a.index) - int64(b.index)) })
	out := make([]string, len(blocks))
	for i, b := range blocks {
		out[i] = b.path
	}
	return out, nil
}

func prepareBackup(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return os.MkdirAll(dir, 0o700)
	case err != nil:
		return fmt.Errorf("journal: backup directory: %w", err)
	case len(entries) > 0:
		return fmt.Errorf("%w: %s holds %d entries", ErrBackupNotEmpty, dir, len(entries))
	}
	return nil
}

func cutBlock(dir, path string, off int64) error {
	f, err := fsx.OpenFile(dir, path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("journal: cut %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Truncate(off); err != nil {
		return fmt.Errorf("journal: cut %s at %d: %w", path, off, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("journal: cut %s: fsync: %w", path, err)
	}
	return nil
}

// syncTree fsyncs every file and directory below root, then root's parent.
func syncTree(root string) error {
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return syncPath(p)
	})
	if err != nil {
		return err
	}
	return syncDir(filepath.Dir(root))
}

func syncDir(dir string) error { return syncPath(dir) }

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
