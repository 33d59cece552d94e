package journal

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// settle makes every block's ctime older than the racy window, as a store
// written some time ago is, by shrinking the window for the test: waiting
// out the real two seconds per step would only slow the suite.
func settle(t *testing.T) {
	t.Helper()
	old := racyWindow
	racyWindow = 20 * time.Millisecond
	t.Cleanup(func() { racyWindow = old })
	time.Sleep(3 * racyWindow)
}

func sizeOf(t *testing.T, paths []string) int64 {
	t.Helper()
	var n int64
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

func verifyAgain(t *testing.T, dir string, prev map[uint32]blockMark) (map[uint32]blockMark, BlockCheck) {
	t.Helper()
	next, chk, err := verifyBlocksSince(dir, testStream, prev, time.Now())
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	return next, chk
}

// TestVerifyBlocksSince walks the rule of verified.go over a store of many
// blocks written by a real server: what may be skipped is skipped, and
// every way a verified block can change through the filesystem makes it
// read again, so damage there is caught.
func TestVerifyBlocksSince(t *testing.T) {
	clean := writeStore(t, storeSpec{})
	blocks := blockNames(t, clean)
	if len(blocks) < 3 {
		t.Fatalf("store has %d blocks, want several", len(blocks))
	}
	settle(t)
	total := sizeOf(t, blocks)

	first, chk := verifyAgain(t, clean, nil)
	if chk.Whole != len(blocks) || chk.Skipped != 0 || chk.Bytes != total {
		t.Fatalf("first check %+v, want all %d blocks (%d bytes) read whole", chk, len(blocks), total)
	}
	again, chk := verifyAgain(t, clean, first)
	if chk.Skipped != len(blocks) || chk.Bytes != 0 {
		t.Fatalf("unchanged store: %+v, want every block skipped, 0 bytes", chk)
	}
	if len(again) != len(first) {
		t.Fatalf("marks %d, want %d", len(again), len(first))
	}

	// Damage in a sealed block, written through the filesystem, even with
	// its size and mtime put back as they were.
	t.Run("rewritten sealed block", func(t *testing.T) {
		dir, marks := settledCopy(t, clean)
		victim := blockNames(t, dir)[0]
		fi, err := os.Stat(victim)
		if err != nil {
			t.Fatal(err)
		}
		buf := readFile(t, victim)
		r := records(t, buf)[1]
		buf[r.off+r.rl-recordHashLen-1] ^= 0x01 // a payload byte
		writeFile(t, victim, buf)
		if err := os.Chtimes(victim, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
		_, _, err = verifyBlocksSince(dir, testStream, marks, time.Now())
		assertCorrupt(t, err, &CorruptError{File: victim, Offset: int64(r.off), Reason: "checksum mismatch"})
	})

	// A block replaced by another file (a restore, a compaction's rename).
	t.Run("replaced block", func(t *testing.T) {
		dir, marks := settledCopy(t, clean)
		victim := blockNames(t, dir)[1]
		buf := readFile(t, victim)
		if err := os.Remove(victim); err != nil {
			t.Fatal(err)
		}
		writeFile(t, victim, buf)
		time.Sleep(3 * racyWindow)
		_, chk := verifyAgain(t, dir, marks)
		if chk.Whole != 1 || chk.Skipped != len(blocks)-1 || chk.Bytes != int64(len(buf)) {
			t.Fatalf("%+v, want the replaced block alone read whole", chk)
		}
	})

	// The last block grows: only what it gained is read; damage in the
	// new records is reported at its place in the block.
	t.Run("grown block", func(t *testing.T) {
		dir, marks := settledCopy(t, clean)
		last := blockNames(t, dir)[len(blocks)-1]
		buf := readFile(t, last)
		rec := buf[records(t, buf)[0].off:records(t, buf)[0].rl] // a valid record of this block
		writeFile(t, last, append(append([]byte{}, buf...), rec...))
		next, chk := verifyAgain(t, dir, marks)
		if chk.Tails != 1 || chk.Whole != 0 || chk.Bytes != int64(len(rec)+recordHashLen) {
			t.Fatalf("%+v, want the last block's %d new bytes (and the 8 checked before them) alone", chk, len(rec))
		}
		// Then a torn record at its end: found, at the right offset.
		grown := readFile(t, last)
		writeFile(t, last, append(grown, rec[:recordHeaderLen+3]...))
		_, _, err := verifyBlocksSince(dir, testStream, next, time.Now())
		assertCorrupt(t, err, &CorruptError{File: last, Offset: int64(len(grown)), Reason: "record overruns end of file (length " + itoa(len(rec)) + ", " + itoa(recordHeaderLen+3) + " bytes left)"})
	})

	// A block that grew after its verified bytes were rewritten: the check
	// of the 8 bytes before the growth fails, so it is read whole.
	t.Run("grown block with a rewritten prefix", func(t *testing.T) {
		dir, marks := settledCopy(t, clean)
		last := blockNames(t, dir)[len(blocks)-1]
		buf := readFile(t, last)
		recs := records(t, buf)
		end := recs[len(recs)-1]
		buf[end.off+end.rl-1] ^= 0x01 // the last verified record's checksum
		writeFile(t, last, append(buf, buf[recs[0].off:recs[0].rl]...))
		_, _, err := verifyBlocksSince(dir, testStream, marks, time.Now())
		assertCorrupt(t, err, &CorruptError{File: last, Offset: int64(end.off), Reason: "checksum mismatch"})
	})

	// Shrunk (truncated by a repair, or by the server) is read whole.
	t.Run("shrunk block", func(t *testing.T) {
		dir, marks := settledCopy(t, clean)
		last := blockNames(t, dir)[len(blocks)-1]
		buf := readFile(t, last)
		recs := records(t, buf)
		if err := os.Truncate(last, int64(recs[len(recs)-1].off)); err != nil {
			t.Fatal(err)
		}
		_, chk := verifyAgain(t, dir, marks)
		if chk.Whole != 1 || chk.Bytes != int64(recs[len(recs)-1].off) {
			t.Fatalf("%+v, want the shrunk block read whole", chk)
		}
	})

	// A block recorded within the racy window is never skipped: a write in
	// the same timestamp tick could have left every field equal.
	t.Run("racy mark", func(t *testing.T) {
		marks, _ := verifyAgain(t, clean, nil)
		for i, m := range marks {
			m.racy = true
			marks[i] = m
		}
		_, chk := verifyAgain(t, clean, marks)
		if chk.Whole != len(blocks) || chk.Skipped != 0 {
			t.Fatalf("%+v, want racy marks ignored", chk)
		}
		racyWindow = time.Hour
		defer func() { racyWindow = 20 * time.Millisecond }()
		fresh, _ := verifyAgain(t, clean, nil)
		for i, m := range fresh {
			if !m.racy {
				t.Fatalf("block %d written just now recorded as settled", i)
			}
		}
	})

	// Verified longer ago than ScrubAge: read whole again, which is what
	// catches damage below the filesystem that moves no file time.
	t.Run("scrub age", func(t *testing.T) {
		marks, _ := verifyAgain(t, clean, nil)
		for i, m := range marks {
			m.whole = time.Now().Add(-ScrubAge - time.Minute).Unix()
			marks[i] = m
		}
		next, chk := verifyAgain(t, clean, marks)
		if chk.Whole != len(blocks) {
			t.Fatalf("%+v, want blocks past the scrub age read whole", chk)
		}
		future := maps.Clone(next)
		for i, m := range future {
			m.whole = time.Now().Add(time.Hour).Unix()
			future[i] = m
		}
		if _, chk := verifyAgain(t, clean, future); chk.Whole != len(blocks) {
			t.Fatalf("%+v, want blocks recorded in the future (clock set back) read whole", chk)
		}
		for i, m := range next {
			if time.Since(time.Unix(m.whole, 0)) > time.Minute {
				t.Fatalf("block %d: scrub time not renewed", i)
			}
		}
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

// settledCopy is a copy of the store at src, old enough that marks taken
// of it are not racy, and those marks.
func settledCopy(t *testing.T, src string) (string, map[uint32]blockMark) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "msgs")
	copyDir(t, src, dir)
	time.Sleep(3 * racyWindow)
	marks, _ := verifyAgain(t, dir, nil)
	if _, chk := verifyAgain(t, dir, marks); chk.Skipped != chk.Blocks {
		t.Fatalf("settled copy: %+v, want every block skipped", chk)
	}
	return dir, marks
}

// TestVerifiedRecordTornOrLying: a torn VERIFIED is ignored (full check);
// one that lies about a damaged block, as damage below the filesystem
// would look, makes Open skip that block, and then the server's own read
// is the only check left: it must not hand back the damaged bytes. This
// is the case the scrub age bounds.
func TestVerifiedRecordTornOrLying(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	j := openTest(t, dir)
	appendN(t, j, 0, 50)
	j.Close()
	settle(t)

	j2 := openTest(t, dir)
	if c := j2.BlockCheck(); c.Whole != 1 || c.Blocks != 1 {
		t.Fatalf("first open after appends: %+v", c)
	}
	j2.Close()
	if marks := readMarks(dir); len(marks) != 1 {
		t.Fatalf("VERIFIED holds %d blocks, want 1", len(readMarks(dir)))
	}

	// Torn: every prefix of the file is refused as a whole.
	data := readFile(t, filepath.Join(dir, verifiedFile))
	for _, n := range []int{0, 10, len(data) / 2, len(data) - 1} {
		if _, err := parseMarks(data[:n]); !errors.Is(err, errBadMarks) {
			t.Fatalf("VERIFIED torn at %d of %d bytes parsed: %v", n, len(data), err)
		}
	}
	writeFile(t, filepath.Join(dir, verifiedFile), data[:len(data)/2])
	j3 := openTest(t, dir)
	if c := j3.BlockCheck(); c.Whole != 1 || c.Skipped != 0 {
		t.Fatalf("open with a torn VERIFIED: %+v, want a whole check", c)
	}
	j3.Close()

	// Lying: damage a payload byte of the verified block, then make the
	// record describe the block as it is now.
	blk := blockNames(t, j3.msgsDir())[0]
	buf := readFile(t, blk)
	r := records(t, buf)[10]
	buf[r.off+r.rl-recordHashLen-1] ^= 0x01
	writeFile(t, blk, buf)
	time.Sleep(3 * racyWindow)
	if _, _, err := verifyBlocksSince(j3.msgsDir(), StreamName, nil, time.Now()); err == nil {
		t.Fatal("the damaged block verified clean")
	}
	f, err := os.Open(blk)
	if err != nil {
		t.Fatal(err)
	}
	st, err := statOf(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	m := blockMark{dev: st.dev, ino: st.ino, size: st.size, mtime: st.mtime, ctime: st.ctime, whole: time.Now().Unix()}
	copy(m.tail[:], buf[len(buf)-8:])
	idx, ok := parseIndex(filepath.Base(blk), blockSuffix)
	if !ok {
		t.Fatalf("block name %s", blk)
	}
	if err := writeMarks(dir, map[uint32]blockMark{idx: m}); err != nil {
		t.Fatal(err)
	}
	j4, err := Open(context.Background(), Options{Dir: dir})
	if err != nil {
		t.Fatalf("open with a record vouching for the block: %v", err)
	}
	defer j4.Close()
	if c := j4.BlockCheck(); c.Skipped != 1 {
		t.Fatalf("%+v, want the block skipped on the lying record's word", c)
	}
	// What the server does (nats-server 2.15): it skips the record whose
	// checksum fails, silently, and hands out the others. The damaged
	// bytes never reach nexus; the gap in sequence is what `nexus replay
	// verify` reports, and the scrub age bounds how long Open trusts the
	// record.
	var seqs []uint64
	err = j4.Read(context.Background(), 1, Subjects, func(rec Record) error {
		seqs = append(seqs, rec.Seq)
		if rec.Seq == r.seq {
			t.Errorf("the server handed out record %d with a bad checksum: %q", rec.Seq, rec.Data)
		}
		return nil
	})
	if err == nil && len(seqs) != 49 {
		t.Fatalf("read %d records and no error, want the 49 undamaged ones (or an error)", len(seqs))
	}
	got := len(seqs)
	t.Logf("server's own check: read %d of 50 records, then: %v", got, err)
}

// TestOpenVerifiesOnlyWhatChanged is the structural test of the journal's
// open: a second open of an unchanged journal reads no byte of
// its blocks, appends cost the next open what they added, and a block
// changed in place is verified again (and its damage refused).
func TestOpenVerifiesOnlyWhatChanged(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	j := openTest(t, dir)
	appendN(t, j, 0, 200)
	j.Close()
	settle(t)
	blk := blockNames(t, j.msgsDir())
	total := sizeOf(t, blk)

	j = openTest(t, dir)
	if c := j.BlockCheck(); c.Whole != len(blk) || c.Bytes != total {
		t.Fatalf("first open: %+v, want %d blocks, %d bytes verified", c, len(blk), total)
	}
	j.Close()
	j = openTest(t, dir)
	if c := j.BlockCheck(); c.Skipped != len(blk) || c.Blocks != len(blk) || c.Bytes != 0 {
		t.Fatalf("second open of an unchanged journal: %+v, want 0 bytes verified", c)
	}
	appendN(t, j, 200, 20)
	j.Close()
	grown := sizeOf(t, blockNames(t, j.msgsDir()))

	j = openTest(t, dir)
	if c := j.BlockCheck(); c.Tails != 1 || c.Whole != 0 || c.Bytes != grown-total+recordHashLen {
		t.Fatalf("open after 20 appends: %+v, want the %d appended bytes (and 8 before them) alone", c, grown-total)
	}
	if n := len(readAll(t, j, 1, Subjects)); n != 220 {
		t.Fatalf("read %d records, want 220", n)
	}
	j.Close()

	// A byte changed in place: the block is verified again, whole.
	time.Sleep(3 * racyWindow)
	last := blockNames(t, j.msgsDir())[0]
	buf := readFile(t, last)
	r := records(t, buf)[3]
	buf[r.off+r.rl-recordHashLen-1] ^= 0x01
	writeFile(t, last, buf)
	_, err := Open(context.Background(), Options{Dir: dir})
	assertCorrupt(t, err, &CorruptError{File: last, Offset: int64(r.off), Reason: "checksum mismatch"})
}
