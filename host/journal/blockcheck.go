package journal

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/minio/highwayhash"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// These mirror the on-disk record layout of nats-server's filestore
// (msgHdrSize, recordHashSize, rlBadThresh, hbit in server/filestore.go,
// v2.15). If a server upgrade changes the format, the clean-store test
// fails instead of nexus refusing a healthy journal in production.
const (
	recordHeaderLen = 22 // rl(4) seq(8) ts(8) slen(2)
	recordHashLen   = 8
	minRecordLen    = recordHeaderLen + recordHashLen
	maxRecordLen    = 32 << 20
	headersBit      = 1 << 31
	hdrLenFieldLen  = 4

	blockSuffix = ".blk"
	keySuffix   = ".key"
)

// compressedMagic starts an S2-compressed block ("cmp" + algorithm 1).
var compressedMagic = []byte{'c', 'm', 'p', 1}

// CorruptError reports the first damaged record found in a stream's message blocks.
type CorruptError struct {
	File   string // absolute path of the .blk file
	Offset int64  // byte offset of the bad record
	Reason string // e.g. "record overruns end of file", "checksum mismatch"
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("journal block %s damaged at offset %d: %s", e.File, e.Offset, e.Reason)
}

// VerifyStreamBlocks checks every <n>.blk under msgsDir (the stream's msgs directory,
// i.e. <StoreDir>/jetstream/<account>/streams/<stream>/msgs) record by record, the way
// nats-server's filestore reads them: header sanity and the per-block highwayhash-64
// checksum keyed by sha256("<stream>-<index>"). A missing msgsDir is not an error (new store).
// It returns a *CorruptError for the first bad record, another error for I/O failures, nil if clean.
// It must only read, never write or rename anything.
//
// Encrypted or compressed blocks cannot be checked record by record here; they
// yield an error wrapping errors.ErrUnsupported rather than a silent pass, since
// the server would still truncate them on its own if they were damaged.
func VerifyStreamBlocks(msgsDir, stream string) error {
	if stream == "" {
		// The stream name is the checksum key; guessing it would turn every
		// record into a false "checksum mismatch".
		return errors.New("journal: VerifyStreamBlocks needs the stream name")
	}
	// CorruptError promises an absolute path so operators can act on it
	// regardless of the process working directory.
	dir, err := filepath.Abs(msgsDir)
	if err != nil {
		return fmt.Errorf("journal: resolve msgs dir: %w", err)
	}
	blocks, keyed, err := listBlocks(dir)
	if err != nil {
		return err
	}
	for _, b := range blocks {
		path := filepath.Join(dir, b.name)
		if keyed[b.index] {
			return fmt.Errorf("journal: block %s is encrypted and cannot be verified: %w", path, errors.ErrUnsupported)
		}
		buf, err := fsx.ReadFile(dir, b.name) // a link or FIFO there is refused, not followed or blocked on
		if err != nil {
			return fmt.Errorf("journal: read block: %w", err)
		}
		if err := verifyBlock(path, b.index, stream, buf); err != nil {
			return err
		}
	}
	return nil
}

type block struct {
	index uint32
	name  string
}

// listBlocks is the stream's message blocks in stream order, so "first bad
// record" means the earliest damage in the log, and the indexes of the
// blocks that have a key file (encrypted). A missing dir is no blocks.
func listBlocks(dir string) ([]block, map[uint32]bool, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("journal: list msgs dir: %w", err)
	}
	var blocks []block
	keyed := make(map[uint32]bool)
	for _, e := range entries {
		name := e.Name()
		// Strict parsing keeps leftovers such as "3.blk.tmp" from a compaction
		// out of the check, as the server ignores them too.
		if idx, ok := parseIndex(name, blockSuffix); ok {
			blocks = append(blocks, block{idx, name})
		} else if idx, ok := parseIndex(name, keySuffix); ok {
			keyed[idx] = true
		}
	}
	slices.SortFunc(blocks, func(a, b block) int { return cmp.Compare(a.index, b.index) })
	return blocks, keyed, nil
}

func parseIndex(name, suffix string) (uint32, bool) {
	digits, ok := strings.CutSuffix(name, suffix)
	if !ok || digits == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(digits, 10, 32)
	if err != nil {
		return 0, false
	}
	return uint32(n), true
}

// blockHash is the per-block checksum the filestore keys with
// sha256("<stream>-<index>").
func blockHash(index uint32, stream string) (*highwayhash.Digest64, error) {
	key := sha256.Sum256(fmt.Appendf(nil, "%s-%d", stream, index))
	hh, err := highwayhash.NewDigest64(key[:])
	if err != nil {
		return nil, fmt.Errorf("journal: block hash for %s block %d: %w", stream, index, err)
	}
	return hh, nil
}

func verifyBlock(path string, index uint32, stream string, buf []byte) error {
	hh, err := blockHash(index, stream)
	if err != nil {
		return err
	}
	cerr := verifyRecords(path, buf, hh)
	if cerr == nil {
		return nil
	}
	// A plain record whose length happens to spell the compression magic is
	// possible, so the magic only counts when the block does not parse as plain
	// records; the server resolves the same ambiguity the same way.
	if len(buf) > len(compressedMagic) && bytes.HasPrefix(buf, compressedMagic) {
		return fmt.Errorf("journal: block %s is compressed and cannot be verified: %w", path, errors.ErrUnsupported)
	}
	return cerr
}

// verifyRecords walks buf exactly as the server's rebuild does, so anything the
// server would truncate on start is reported, and nothing it accepts is.
// Tombstone (tbit) and erased (ebit) records carry the same header and checksum
// as live ones, so the sequence flags need no special case here.
func verifyRecords(path string, buf []byte, hh *highwayhash.Digest64) *CorruptError {
	off := 0
	for off < len(buf) {
		rl, reason := checkRecord(buf, off, hh)
		if reason != "" {
			return &CorruptError{File: path, Offset: int64(off), Reason: reason}
		}
		off += rl
	}
	return nil
}

// checkRecord checks the record at off: its length, or why it is bad.
func checkRecord(buf []byte, off int, hh *highwayhash.Digest64) (int, string) {
	le := binary.LittleEndian
	var sum [highwayhash.Size64]byte
	left := len(buf) - off
	if left < recordHeaderLen {
		return 0, fmt.Sprintf("record overruns end of file (%d trailing bytes, header needs %d)", left, recordHeaderLen)
	}
	hdr := buf[off : off+recordHeaderLen]
	rl := le.Uint32(hdr[0:4])
	hasHeaders := rl&headersBit != 0
	rl &^= headersBit
	slen := int(le.Uint16(hdr[20:22]))
	// Everything before the hashed payload: the subject and, for records with
	// headers, the 4-byte header length the checksum skips.
	prefix := slen
	if hasHeaders {
		prefix += hdrLenFieldLen
	}

	switch {
	case rl > maxRecordLen:
		return 0, fmt.Sprintf("record length %d exceeds the %d byte limit", rl, maxRecordLen)
	case int(rl) < minRecordLen || prefix > int(rl)-minRecordLen:
		// Also what stops a zero-filled tail from looping forever on rl == 0.
		return 0, fmt.Sprintf("record header fails sanity check (length %d, subject length %d)", rl, slen)
	case int(rl) > left:
		return 0, fmt.Sprintf("record overruns end of file (length %d, %d bytes left)", rl, left)
	}

	rec := buf[off : off+int(rl)]
	body := rec[recordHeaderLen : len(rec)-recordHashLen]
	hh.Reset()
	hh.Write(hdr[4:20])
	hh.Write(body[:slen])
	hh.Write(body[prefix:])
	if !bytes.Equal(hh.Sum(sum[:0]), rec[len(rec)-recordHashLen:]) {
		return 0, "checksum mismatch"
	}
	// The header length sits outside the checksum, yet the server's read path
	// rejects a message whose headers would run past the record.
	if hasHeaders {
		hl := le.Uint32(body[slen:])
		if uint64(hl) > uint64(len(body)-prefix) {
			return 0, fmt.Sprintf("header length %d overruns record (%d bytes available)", hl, len(body)-prefix)
		}
	}
	return int(rl), ""
}
