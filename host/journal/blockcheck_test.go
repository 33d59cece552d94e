package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	testStream   = "NEXUS"
	testMessages = 300
	// Small enough that the server picks its minimum block size (32 kB), so
	// the store spans several blocks and each block's own hash key is exercised.
	testMaxBytes = 120_000
)

type storeSpec struct {
	// allowDelete builds the store nexus never has, to prove tombstone and
	// erased records written by the server are not mistaken for damage.
	allowDelete bool
}

// writeStore lets a real nats-server write a stream to disk, shuts it down
// cleanly and returns the stream's msgs directory.
func writeStore(t *testing.T, spec storeSpec) string {
	t.Helper()
	storeDir := t.TempDir()
	srv, err := server.NewServer(&server.Options{
		JetStream:  true,
		StoreDir:   storeDir,
		DontListen: true,
		SyncAlways: true,
		NoLog:      true,
		NoSigs:     true,
	})
	if err != nil {
		t.Fatalf("new server: %v", err)
	}
	srv.Start()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			srv.Shutdown()
			srv.WaitForShutdown()
		}
	}
	t.Cleanup(stop)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}

	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       testStream,
		Subjects:   []string{"nexus.events.>"},
		Storage:    jetstream.FileStorage,
		MaxBytes:   testMaxBytes,
		Discard:    jetstream.DiscardNew,
		DenyDelete: !spec.allowDelete,
		DenyPurge:  !spec.allowDelete,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}

	for i := range testMessages {
		subj := fmt.Sprintf("nexus.events.kind%d", i%7)
		var opts []jetstream.PublishOpt
		if i%3 == 0 {
			opts = append(opts, jetstream.WithMsgID(msgID(i)))
		}
		if _, err := js.Publish(ctx, subj, payload(i), opts...); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}

	if spec.allowDelete {
		for _, seq := range []uint64{2, 3, 150} {
			if err := stream.DeleteMsg(ctx, seq); err != nil {
				t.Fatalf("delete %d: %v", seq, err)
			}
		}
		if err := stream.SecureDeleteMsg(ctx, 4); err != nil {
			t.Fatalf("secure delete: %v", err)
		}
	}

	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	want := uint64(testMessages)
	if spec.allowDelete {
		want -= 4
	}
	if info.State.Msgs != want {
		t.Fatalf("stream holds %d messages, want %d (limits hit?)", info.State.Msgs, want)
	}

	nc.Close()
	stop()
	return findMsgsDir(t, storeDir)
}

func msgID(i int) string { return fmt.Sprintf("evt-%05d", i) }

func payload(i int) []byte {
	p := fmt.Appendf(nil, "payload-%05d|", i)
	return append(p, bytes.Repeat([]byte{'a' + byte(i%26)}, 180)...)
}

func findMsgsDir(t *testing.T, storeDir string) string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(storeDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "msgs" && filepath.Base(filepath.Dir(path)) == testStream {
			found = append(found, path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk store: %v", err)
	}
	if len(found) != 1 {
		t.Fatalf("found msgs dirs %q, want exactly one", found)
	}
	want := filepath.Join(storeDir, "jetstream", "$G", "streams", testStream, "msgs")
	if found[0] != want {
		t.Fatalf("msgs dir at %s, want %s", found[0], want)
	}
	return found[0]
}

// blockNames lists the .blk files in index order.
func blockNames(t *testing.T, dir string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.blk"))
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(paths, func(a, b string) int {
		var ia, ib int
		fmt.Sscanf(filepath.Base(a), "%d.blk", &ia)
		fmt.Sscanf(filepath.Base(b), "%d.blk", &ib)
		return ia - ib
	})
	return paths
}

type record struct {
	off        int
	rl         int
	hasHeaders bool
	seq        uint64
	slen       int
}

// records splits a clean block by its length fields only, so tests can aim
// damage at a known record without depending on the code under test.
func records(t *testing.T, buf []byte) []record {
	t.Helper()
	var recs []record
	for off := 0; off < len(buf); {
		rl := binary.LittleEndian.Uint32(buf[off:])
		r := record{
			off:        off,
			rl:         int(rl &^ (1 << 31)),
			hasHeaders: rl&(1<<31) != 0,
			seq:        binary.LittleEndian.Uint64(buf[off+4:]),
			slen:       int(binary.LittleEndian.Uint16(buf[off+20:])),
		}
		if r.rl == 0 {
			t.Fatalf("zero-length record at %d in a clean block", off)
		}
		recs = append(recs, r)
		off += r.rl
	}
	return recs
}

// recordAt returns the record in buf that holds byte i.
func recordAt(t *testing.T, buf []byte, i int) record {
	t.Helper()
	for _, r := range records(t, buf) {
		if i >= r.off && i < r.off+r.rl {
			return r
		}
	}
	t.Fatalf("no record holds byte %d", i)
	return record{}
}

// locate finds needle in the store and returns the block holding it, its
// contents, and the index of needle within it.
func locate(t *testing.T, dir string, needle []byte) (string, []byte, int) {
	t.Helper()
	for _, path := range blockNames(t, dir) {
		buf := readFile(t, path)
		if i := bytes.Index(buf, needle); i >= 0 {
			return path, buf, i
		}
	}
	t.Fatalf("%q not found in any block", needle)
	return "", nil, 0
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	buf, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return buf
}

func writeFile(t *testing.T, path string, buf []byte) {
	t.Helper()
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatalf("copy store: %v", err)
	}
}

// snapshot captures every file in dir so a test can prove verification is
// read-only: same names (nothing renamed or created) and same bytes.
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := make(map[string][]byte)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && path == dir {
			return fs.SkipAll
		}
		if err != nil || d.IsDir() {
			return err
		}
		files[path] = readFile(t, path)
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return files
}

// damage edits a copy of the store and returns what VerifyStreamBlocks should
// report; Reason is matched as a substring. nil means the store must pass.
type damage func(t *testing.T, dir string) *CorruptError

func TestVerifyStreamBlocks(t *testing.T) {
	clean := writeStore(t, storeSpec{})
	if n := len(blockNames(t, clean)); n < 3 {
		t.Fatalf("store has %d blocks, want at least 3 to cover per-block keys", n)
	} else {
		t.Logf("server wrote %d blocks", n)
	}

	lastBlock := func(t *testing.T, dir string) (string, []byte) {
		t.Helper()
		names := blockNames(t, dir)
		path := names[len(names)-1]
		return path, readFile(t, path)
	}

	tests := []struct {
		name   string
		stream string // defaults to testStream
		damage damage
		// unsupported expects a refusal that is not a CorruptError.
		unsupported bool
	}{
		{
			name: "clean store",
		},
		{
			name: "truncated mid-record",
			damage: func(t *testing.T, dir string) *CorruptError {
				// An early block, so later intact blocks must not mask it.
				path := blockNames(t, dir)[0]
				buf := readFile(t, path)
				r := records(t, buf)[10]
				writeFile(t, path, buf[:r.off+r.rl/2])
				return &CorruptError{File: path, Offset: int64(r.off), Reason: "record overruns end of file"}
			},
		},
		{
			name: "truncated inside record header",
			damage: func(t *testing.T, dir string) *CorruptError {
				path, buf := lastBlock(t, dir)
				recs := records(t, buf)
				r := recs[len(recs)-1]
				writeFile(t, path, buf[:r.off+recordHeaderLen/2])
				return &CorruptError{File: path, Offset: int64(r.off), Reason: "record overruns end of file"}
			},
		},
		{
			name: "trailing bytes after last record",
			damage: func(t *testing.T, dir string) *CorruptError {
				path, buf := lastBlock(t, dir)
				writeFile(t, path, append(buf, 1, 2, 3, 4, 5))
				return &CorruptError{File: path, Offset: int64(len(buf)), Reason: "record overruns end of file"}
			},
		},
		{
			name: "zero-filled tail",
			damage: func(t *testing.T, dir string) *CorruptError {
				path, buf := lastBlock(t, dir)
				writeFile(t, path, append(buf, make([]byte, 4096)...))
				return &CorruptError{File: path, Offset: int64(len(buf)), Reason: "sanity check"}
			},
		},
		{
			name: "flipped byte in message body",
			damage: func(t *testing.T, dir string) *CorruptError {
				path, buf, i := locate(t, dir, []byte("payload-00151|"))
				buf[i+len("payload-")] ^= 0x01
				writeFile(t, path, buf)
				return &CorruptError{File: path, Offset: int64(recordAt(t, buf, i).off), Reason: "checksum"}
			},
		},
		{
			name: "flipped byte in message header",
			damage: func(t *testing.T, dir string) *CorruptError {
				path, buf, i := locate(t, dir, []byte(msgID(150)))
				r := recordAt(t, buf, i)
				if !r.hasHeaders {
					t.Fatal("message with a Nats-Msg-Id was stored without headers")
				}
				buf[i+len(msgID(150))-1] ^= 0x01
				writeFile(t, path, buf)
				return &CorruptError{File: path, Offset: int64(r.off), Reason: "checksum"}
			},
		},
		{
			name: "flipped bit in sequence",
			damage: func(t *testing.T, dir string) *CorruptError {
				path, buf := lastBlock(t, dir)
				r := records(t, buf)[1]
				buf[r.off+4] ^= 0x10
				writeFile(t, path, buf)
				return &CorruptError{File: path, Offset: int64(r.off), Reason: "checksum"}
			},
		},
		{
			name: "header length outside checksum overruns record",
			damage: func(t *testing.T, dir string) *CorruptError {
				path, buf, i := locate(t, dir, []byte(msgID(201)))
				r := recordAt(t, buf, i)
				binary.LittleEndian.PutUint32(buf[r.off+recordHeaderLen+r.slen:], 1<<20)
				writeFile(t, path, buf)
				return &CorruptError{File: path, Offset: int64(r.off), Reason: "header length"}
			},
		},
		{
			name: "oversized record length",
			damage: func(t *testing.T, dir string) *CorruptError {
				path := blockNames(t, dir)[1]
				buf := readFile(t, path)
				binary.LittleEndian.PutUint32(buf[0:], 0x7fffffff)
				writeFile(t, path, buf)
				return &CorruptError{File: path, Offset: 0, Reason: "exceeds"}
			},
		},
		{
			name:   "wrong stream name keys a different checksum",
			stream: "OTHER",
			damage: func(t *testing.T, dir string) *CorruptError {
				return &CorruptError{File: blockNames(t, dir)[0], Offset: 0, Reason: "checksum"}
			},
		},
		{
			name: "blocks renumbered",
			damage: func(t *testing.T, dir string) *CorruptError {
				// The index is part of the hash key, so a block moved to another
				// number is caught even though its records are intact.
				names := blockNames(t, dir)
				last := names[len(names)-1]
				moved := filepath.Join(dir, "999.blk")
				if err := os.Rename(last, moved); err != nil {
					t.Fatal(err)
				}
				return &CorruptError{File: moved, Offset: 0, Reason: "checksum"}
			},
		},
		{
			name: "missing msgs dir",
			damage: func(t *testing.T, dir string) *CorruptError {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				return nil
			},
		},
		{
			name: "empty block file",
			damage: func(t *testing.T, dir string) *CorruptError {
				writeFile(t, filepath.Join(dir, "1000.blk"), nil)
				return nil
			},
		},
		{
			name: "non-block files ignored",
			damage: func(t *testing.T, dir string) *CorruptError {
				junk := []byte("not a block at all")
				writeFile(t, filepath.Join(dir, "1.blk.tmp"), junk)
				writeFile(t, filepath.Join(dir, "x.blk"), junk)
				writeFile(t, filepath.Join(dir, "1.idx"), junk)
				return nil
			},
		},
		{
			name:        "encrypted block refused",
			unsupported: true,
			damage: func(t *testing.T, dir string) *CorruptError {
				writeFile(t, filepath.Join(dir, "1.key"), []byte("sealed key"))
				return nil
			},
		},
		{
			name:        "compressed block refused",
			unsupported: true,
			damage: func(t *testing.T, dir string) *CorruptError {
				path := blockNames(t, dir)[0]
				writeFile(t, path, append([]byte{'c', 'm', 'p', 1, 0x80, 0x01}, bytes.Repeat([]byte{0xee}, 64)...))
				return nil
			},
		},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "msgs")
			copyDir(t, clean, dir)
			var want *CorruptError
			if tc.damage != nil {
				want = tc.damage(t, dir)
			}
			stream := tc.stream
			if stream == "" {
				stream = testStream
			}

			before := snapshot(t, dir)
			err := VerifyStreamBlocks(dir, stream)
			assertUnchanged(t, before, snapshot(t, dir))

			switch {
			case tc.unsupported:
				var ce *CorruptError
				if !errors.Is(err, errors.ErrUnsupported) || errors.As(err, &ce) {
					t.Fatalf("got %v, want an ErrUnsupported refusal", err)
				}
			case want == nil:
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
			default:
				assertCorrupt(t, err, want)
			}
		})
	}
}

func TestVerifyStreamBlocksAcceptsTombstones(t *testing.T) {
	dir := writeStore(t, storeSpec{allowDelete: true})

	const tbit, ebit = 1 << 62, 1 << 63
	var flagged int
	for _, path := range blockNames(t, dir) {
		for _, r := range records(t, readFile(t, path)) {
			if r.seq&(tbit|ebit) != 0 {
				flagged++
			}
		}
	}
	if flagged == 0 {
		t.Fatal("deletes left no tombstone or erased records; the test covers nothing")
	}

	t.Logf("server wrote %d tombstone/erased records", flagged)

	before := snapshot(t, dir)
	if err := VerifyStreamBlocks(dir, testStream); err != nil {
		t.Fatalf("store with %d tombstone/erased records: %v", flagged, err)
	}
	assertUnchanged(t, before, snapshot(t, dir))
}

func TestVerifyStreamBlocksRelativePath(t *testing.T) {
	dir := writeStore(t, storeSpec{})
	path := blockNames(t, dir)[0]
	buf := readFile(t, path)
	writeFile(t, path, buf[:len(buf)-1])

	t.Chdir(filepath.Dir(dir))
	var ce *CorruptError
	if err := VerifyStreamBlocks("msgs", testStream); !errors.As(err, &ce) {
		t.Fatalf("got %v, want *CorruptError", err)
	}
	if ce.File != path {
		t.Fatalf("File = %q, want absolute %q", ce.File, path)
	}
}

func assertCorrupt(t *testing.T, err error, want *CorruptError) {
	t.Helper()
	var ce *CorruptError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want *CorruptError", err)
	}
	if ce.File != want.File || ce.Offset != want.Offset || !strings.Contains(ce.Reason, want.Reason) {
		t.Fatalf("got %s\nwant file %s offset %d reason containing %q", ce, want.File, want.Offset, want.Reason)
	}
	line := fmt.Sprintf("journal block %s damaged at offset %d: %s", ce.File, ce.Offset, ce.Reason)
	if msg := ce.Error(); msg != line || strings.Contains(msg, "\n") {
		t.Fatalf("Error() = %q, want %q", msg, line)
	}
}

func assertUnchanged(t *testing.T, before, after map[string][]byte) {
	t.Helper()
	if !slices.Equal(slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after))) {
		t.Fatalf("files changed: before %v, after %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}
	for path, b := range before {
		if !bytes.Equal(b, after[path]) {
			t.Fatalf("%s was modified", path)
		}
	}
}
