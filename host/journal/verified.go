package journal

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// Incremental block verification.
//
// Open must catch a damaged block before the server loads it (the server
// truncates what it cannot parse), but reading every block on every open
// makes opening O(history). Blocks are append-only: the file store writes
// records at the end of the newest block, seals it at its size limit, and
// rewrites a block only through a new file renamed into place or by
// truncating it. So after Open verifies a block it records, in
// journal/VERIFIED, the block's identity and state as fstat saw it while
// the block was being read (device, inode, size, mtime, ctime) and the
// last 8 bytes at that size (the checksum of the last record verified).
//
// The rule for what a later Open may skip:
//
//   - unchanged (same device, inode, size, mtime and ctime, and the same
//     last 8 bytes, read again): not read. ctime cannot be set from user
//     space, and every write, truncate or chmod of the file moves it, so
//     any change made through the filesystem, however its mtime is
//     restored afterwards, makes the block "changed";
//   - grown (same device and inode, larger): only the records after the
//     verified size are read and checked, once the 8 bytes before that
//     size still hold the checksum recorded there. If either check fails
//     the block is verified whole, which alone decides whether it is bad;
//   - anything else (new, shrunk, another inode, same size but new times,
//     recorded "racily", or verified whole more than ScrubAge ago): read
//     and verified whole.
//
// "Racily" is git's racy-clean problem: file times have a granularity (a
// kernel tick, or a second on some filesystems), so a write in the same
// tick as the fstat that recorded a block can leave every field equal. A
// block whose ctime is within racyWindow of the moment it was recorded is
// therefore never skipped; it is read again (whole) next time, when it is
// old enough to be recorded for good.
//
// What this cannot see is damage below the filesystem (a bit flipped on
// the medium, a write to the raw device) in a block recorded as verified:
// no time moves. Such a block is verified whole again once its record is
// older than ScrubAge; until then only the server's own checks see it
// when it loads the block (a bad checksum fails that read; a bad record
// header makes the server truncate the block there, as it would have
// without nexus). A torn or stale VERIFIED costs a full verification,
// never a skipped check: its content carries a sha256, a torn copy fails
// it and is ignored, and a stale copy describes blocks as they were, so
// every block changed since no longer matches it. Before a block is
// recorded it is fsynced, so a record never vouches for bytes that a power
// loss could still take back.

const (
	verifiedFile   = "VERIFIED"
	verifiedHeader = "nexus-verified-blocks 1"
	// ScrubAge is how long a block recorded as verified is trusted before
	// Open reads it whole again.
	ScrubAge = 24 * time.Hour
)

// racyWindow is how close to the moment of recording a block's ctime may
// be before the record cannot be trusted to skip it. Two seconds covers
// filesystems with one-second timestamps; tests shorten it.
var racyWindow = 2 * time.Second

// BlockCheck is what Open's verification of the message blocks did.
type BlockCheck struct {
	Blocks  int   // message blocks in the store
	Skipped int   // unchanged since verified: only the last 8 bytes read
	Tails   int   // grown since verified: only the new records read
	Whole   int   // read and verified whole
	Bytes   int64 // bytes of record data checked, the 8-byte checks aside
}

// blockMark is one block as it was when verified.
type blockMark struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // ns since the epoch
	tail         [8]byte
	racy         bool
	whole        int64 // unix seconds of the last whole verification
}

type blockState struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

func statOf(f *os.File) (blockState, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return blockState{}, fmt.Errorf("journal: stat block %s: %w", f.Name(), err)
	}
	return blockState{
		dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(),
	}, nil
}

func (m blockMark) state() blockState {
	return blockState{dev: m.dev, ino: m.ino, size: m.size, mtime: m.mtime, ctime: m.ctime}
}

// verifyBlocksSince verifies the blocks under msgsDir as VerifyStreamBlocks
// does, except what prev (from an earlier call) shows needs no reading; see
// the rule above. It returns the marks to record for the next call. On any
// error nothing may be recorded.
func verifyBlocksSince(msgsDir, stream string, prev map[uint32]blockMark, now time.Time) (map[uint32]blockMark, BlockCheck, error) {
	var chk BlockCheck
	if stream == "" {
		return nil, chk, errors.New("journal: verify needs the stream name")
	}
	dir, err := filepath.Abs(msgsDir)
	if err != nil {
		return nil, chk, fmt.Errorf("journal: resolve msgs dir: %w", err)
	}
	blocks, keyed, err := listBlocks(dir)
	if err != nil {
		return nil, chk, err
	}
	next := make(map[uint32]blockMark, len(blocks))
	for _, b := range blocks {
		path := filepath.Join(dir, b.name)
		if keyed[b.index] {
			return nil, chk, fmt.Errorf("journal: block %s is encrypted and cannot be verified: %w", path, errors.ErrUnsupported)
		}
		chk.Blocks++
		m, err := checkBlock(dir, b, stream, prev, now, &chk)
		if err != nil {
			return nil, chk, err
		}
		if m != nil {
			next[b.index] = *m
		}
	}
	return next, chk, nil
}

// checkBlock verifies one block as little as the rule allows and returns
// its new mark (nil: record nothing, verify it whole next time).
func checkBlock(dir string, b block, stream string, prev map[uint32]blockMark, now time.Time, chk *BlockCheck) (*blockMark, error) {
	path := filepath.Join(dir, b.name)
	f, err := fsx.Open(dir, b.name) // a link or FIFO there is refused, not followed or blocked on
	if err != nil {
		return nil, fmt.Errorf("journal: read block: %w", err)
	}
	defer f.Close()
	st, err := statOf(f)
	if err != nil {
		return nil, err
	}
	old, known := prev[b.index]
	known = known && old.dev == st.dev && old.ino == st.ino && old.size >= int64(len(old.tail))
	// A record from the future (the clock was set back since) is not
	// trusted to postpone the scrub.
	since := now.Sub(time.Unix(old.whole, 0))
	fresh := since >= -time.Minute && since < ScrubAge

	var last [8]byte
	if known && fresh && !old.racy && old.state() == st {
		if err := readTail(f, old.size, &last); err != nil {
			return nil, err
		}
		if last == old.tail {
			chk.Skipped++
			return &old, nil
		}
	}
	wholeAt := now.Unix()
	var checked int64
	if known && fresh && st.size > old.size {
		if n, ok, err := verifyGrowth(f, path, b.index, stream, old, st.size, &last); err != nil {
			return nil, err
		} else if ok {
			chk.Tails++
			checked, wholeAt = n, old.whole
		}
	}
	if checked == 0 {
		buf := make([]byte, st.size)
		if _, err := io.ReadFull(io.NewSectionReader(f, 0, st.size), buf); err != nil {
			return nil, fmt.Errorf("journal: read block %s: %w", path, err)
		}
		if err := verifyBlock(path, b.index, stream, buf); err != nil {
			return nil, err
		}
		chk.Whole++
		checked = st.size
		if len(buf) >= len(last) {
			copy(last[:], buf[len(buf)-len(last):])
		}
	}
	chk.Bytes += checked
	// The record may only vouch for what is durable and for what was read:
	// fsync, then the block must be as it was when the read began.
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("journal: sync block %s: %w", path, err)
	}
	after, err := statOf(f)
	if err != nil {
		return nil, err
	}
	// Racy against the clock at this fstat, not the start of the whole
	// check, which may have begun long before on a large store.
	statAt := time.Now()
	if after != st || st.size < int64(len(last)) {
		return nil, nil
	}
	return &blockMark{
		dev: st.dev, ino: st.ino, size: st.size, mtime: st.mtime, ctime: st.ctime,
		tail: last, racy: time.Unix(0, st.ctime).After(statAt.Add(-racyWindow)), whole: wholeAt,
	}, nil
}

func readTail(f *os.File, size int64, into *[8]byte) error {
	if _, err := f.ReadAt(into[:], size-int64(len(into))); err != nil {
		return fmt.Errorf("journal: read block %s: %w", f.Name(), err)
	}
	return nil
}

// verifyGrowth checks the records a block gained after old.size. ok is
// false, with no error, when the cheap check of the verified prefix or the
// new records fail: the caller then verifies the whole block, which alone
// reports damage, so a block rewritten in a way the rule did not foresee
// costs a read, not a false alarm.
func verifyGrowth(f *os.File, path string, index uint32, stream string, old blockMark, size int64, last *[8]byte) (int64, bool, error) {
	from := old.size - int64(len(old.tail))
	buf := make([]byte, size-from)
	if _, err := io.ReadFull(io.NewSectionReader(f, from, size-from), buf); err != nil {
		return 0, false, fmt.Errorf("journal: read block %s: %w", path, err)
	}
	if !bytes.Equal(buf[:len(old.tail)], old.tail[:]) {
		return 0, false, nil
	}
	hh, err := blockHash(index, stream)
	if err != nil {
		return 0, false, err
	}
	if verifyRecords(path, buf[len(old.tail):], hh) != nil {
		return 0, false, nil
	}
	copy(last[:], buf[len(buf)-len(last):])
	return int64(len(buf)), true, nil
}

// readMarks loads journal/VERIFIED; anything missing, torn or unreadable
// is no marks at all, which means verifying every block.
func readMarks(dir string) map[uint32]blockMark {
	root, rel := filepath.Dir(dir), filepath.Join(filepath.Base(dir), verifiedFile)
	data, err := fsx.ReadFile(root, rel)
	if err != nil {
		return nil
	}
	marks, err := parseMarks(data)
	if err != nil {
		return nil
	}
	return marks
}

func writeMarks(dir string, marks map[uint32]blockMark) error {
	root, rel := filepath.Dir(dir), filepath.Join(filepath.Base(dir), verifiedFile)
	// No fsync: losing or tearing this file costs a full verification.
	if err := fsx.Replace(root, rel, formatMarks(marks), 0o600); err != nil {
		return fmt.Errorf("journal: record verified blocks: %w", err)
	}
	return nil
}

func formatMarks(marks map[uint32]blockMark) []byte {
	var b bytes.Buffer
	b.WriteString(verifiedHeader + "\n")
	for _, idx := range slices.Sorted(maps.Keys(marks)) {
		m := marks[idx]
		racy := 0
		if m.racy {
			racy = 1
		}
		fmt.Fprintf(&b, "%d %d %d %d %d %d %s %d %d\n", idx, m.dev, m.ino, m.size, m.mtime, m.ctime, hex.EncodeToString(m.tail[:]), racy, m.whole)
	}
	sum := sha256.Sum256(b.Bytes())
	fmt.Fprintf(&b, "sha256 %s\n", hex.EncodeToString(sum[:]))
	return b.Bytes()
}

var errBadMarks = errors.New("journal: VERIFIED is damaged")

func parseMarks(data []byte) (map[uint32]blockMark, error) {
	i := bytes.LastIndex(data, []byte("sha256 "))
	if i < 0 {
		return nil, errBadMarks
	}
	sum := sha256.Sum256(data[:i])
	if string(data[i:]) != "sha256 "+hex.EncodeToString(sum[:])+"\n" {
		return nil, errBadMarks
	}
	sc := bufio.NewScanner(bytes.NewReader(data[:i]))
	if !sc.Scan() || sc.Text() != verifiedHeader {
		return nil, errBadMarks
	}
	marks := make(map[uint32]blockMark)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 9 {
			return nil, errBadMarks
		}
		var n [9]uint64
		for k, s := range f {
			if k == 6 {
				continue
			}
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return nil, errBadMarks
			}
			n[k] = v
		}
		tail, err := hex.DecodeString(f[6])
		if err != nil || len(tail) != 8 || n[0] > 1<<32-1 || n[7] > 1 {
			return nil, errBadMarks
		}
		m := blockMark{dev: n[1], ino: n[2], size: int64(n[3]), mtime: int64(n[4]), ctime: int64(n[5]), racy: n[7] == 1, whole: int64(n[8])}
		copy(m.tail[:], tail)
		marks[uint32(n[0])] = m
	}
	return marks, nil
}
