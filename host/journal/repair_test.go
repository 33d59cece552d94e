package journal

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// buildJournal appends n records of growing size, closes the journal, and
// returns its directory, its only block, and the block's size after each
// record (so ends[i] is where record i+1 ends).
func buildJournal(t *testing.T, n int) (dir, block string, ends []int64) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "journal")
	j, err := Open(context.Background(), Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := appendOne(j, i, 10*i, false); err != nil {
			t.Fatal(err)
		}
		blocks, _ := filepath.Glob(filepath.Join(j.msgsDir(), "*.blk"))
		if len(blocks) != 1 {
			t.Fatalf("%d blocks, want 1", len(blocks))
		}
		block = blocks[0]
		fi, err := os.Stat(block)
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, fi.Size())
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, block, ends
}

// digest maps every file under dir but the lock to its sha256.
func digest(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == lockFile {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = sha256.Sum256(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameFiles(a, b map[string][32]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func wantRefusedOpen(t *testing.T, dir string) {
	t.Helper()
	j, err := Open(context.Background(), Options{Dir: dir})
	var ce *CorruptError
	if !errors.As(err, &ce) {
		if j != nil {
			j.Close()
		}
		t.Fatalf("Open of a damaged journal: %v, want a *CorruptError", err)
	}
}

func TestRepairCutsTornTail(t *testing.T) {
	dir, block, ends := buildJournal(t, 20)
	torn := ends[19] - 7 // mid-record 20
	if err := os.Truncate(block, torn); err != nil {
		t.Fatal(err)
	}
	wantRefusedOpen(t, dir)
	before := digest(t, dir)
	backup := filepath.Join(t.TempDir(), "backup")

	rep, err := Repair(dir, backup)
	if err != nil {
		t.Fatal(err)
	}
	want := RepairReport{Dir: dir, Backup: backup, Block: block, Offset: ends[18], CutBytes: torn - ends[18], LastGoodSeq: 19, FirstLostSeq: 20}
	if rep.Whole || rep.Offset != want.Offset || rep.CutBytes != want.CutBytes || rep.LastGoodSeq != 19 || rep.FirstLostSeq != 20 ||
		rep.Block != block || rep.Backup != backup || rep.Reason == "" {
		t.Fatalf("report %+v\nwant %+v", rep, want)
	}
	if got := digest(t, backup); !sameFiles(got, before) {
		t.Fatalf("backup differs from the store before the repair:\n%v\n%v", got, before)
	}
	if fi, _ := os.Stat(block); fi.Size() != ends[18] {
		t.Fatalf("block is %d bytes after the repair, want %d", fi.Size(), ends[18])
	}
	j := openTest(t, dir)
	got := readAll(t, j, 1, Subjects)
	if len(got) != 19 {
		t.Fatalf("repaired journal holds %d records, want 19", len(got))
	}
	for i, r := range got {
		if r.Seq != uint64(i+1) || r.MsgID != fmt.Sprintf("m-%d", i) {
			t.Fatalf("record %d = seq %d id %s", i, r.Seq, r.MsgID)
		}
	}
	if err := appendOne(j, 100, 0, false); err != nil {
		t.Fatalf("append to the repaired journal: %v", err)
	}
	if last, _ := j.LastSeq(context.Background()); last != 20 {
		t.Fatalf("next append got sequence %d, want 20", last)
	}
}

func TestRepairCutsZeroTail(t *testing.T) {
	dir, block, ends := buildJournal(t, 5)
	f, _ := os.OpenFile(block, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(make([]byte, 100))
	f.Close()
	wantRefusedOpen(t, dir)
	rep, err := Repair(dir, filepath.Join(t.TempDir(), "b"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Offset != ends[4] || rep.CutBytes != 100 || rep.LastGoodSeq != 5 || rep.FirstLostSeq != 0 {
		t.Fatalf("report %+v: want 100 zero bytes cut after sequence 5, no lost sequence known", rep)
	}
	if got := readAll(t, openTest(t, dir), 1, Subjects); len(got) != 5 {
		t.Fatalf("%d records after the repair, want 5", len(got))
	}
}

func TestRepairRefuses(t *testing.T) {
	cases := map[string]struct {
		spoil  func(t *testing.T, block string, ends []int64)
		backup func(t *testing.T) string
		want   error
	}{
		"damage with whole records behind it": {
			spoil: func(t *testing.T, block string, ends []int64) {
				data, _ := os.ReadFile(block)
				data[ends[9]+30] ^= 0x5a // inside record 11, of 20
				os.WriteFile(block, data, 0o600)
			},
			want: ErrNotRepairable,
		},
		"backup directory not empty": {
			spoil: func(t *testing.T, block string, ends []int64) { os.Truncate(block, ends[19]-7) },
			backup: func(t *testing.T) string {
				d := t.TempDir()
				os.WriteFile(filepath.Join(d, "precious"), []byte("x"), 0o600)
				return d
			},
			want: ErrBackupNotEmpty,
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir, block, ends := buildJournal(t, 20)
			c.spoil(t, block, ends)
			before := digest(t, dir)
			backup := filepath.Join(t.TempDir(), "backup")
			if c.backup != nil {
				backup = c.backup(t)
			}
			backupBefore := digest(t, filepath.Dir(backup))
			_, err := Repair(dir, backup)
			if !errors.Is(err, c.want) {
				t.Fatalf("Repair: %v, want %v", err, c.want)
			}
			if !sameFiles(before, digest(t, dir)) {
				t.Fatal("a refused repair changed the journal")
			}
			if !sameFiles(backupBefore, digest(t, filepath.Dir(backup))) {
				t.Fatal("a refused repair wrote into the backup location")
			}
		})
	}
}

func TestRepairWholeOrOpenJournal(t *testing.T) {
	dir, _, _ := buildJournal(t, 3)
	before := digest(t, dir)
	backup := filepath.Join(t.TempDir(), "backup")
	rep, err := Repair(dir, backup)
	if err != nil || !rep.Whole || rep.CutBytes != 0 {
		t.Fatalf("Repair of a whole journal: %+v, %v", rep, err)
	}
	if _, err := os.Stat(backup); !errors.Is(err, fs.ErrNotExist) || !sameFiles(before, digest(t, dir)) {
		t.Fatal("a whole journal was touched, or backed up")
	}
	j := openTest(t, dir)
	_ = j
	if _, err := Repair(dir, backup); !errors.Is(err, ErrLocked) {
		t.Fatalf("Repair of an open journal: %v, want ErrLocked", err)
	}
}
