package disk

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestCopyScratchKeepsBytesAndHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	chunk := bytes.Repeat([]byte("data"), 1<<18) // 1 MiB
	f.WriteAt(chunk, 0)
	f.WriteAt(chunk, 40<<20)
	f.Truncate(64 << 20)
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := CopyScratch(src, dst, nil); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs from source")
	}
	ss, _ := Stat(src)
	ds, _ := Stat(dst)
	if ds.Apparent != ss.Apparent || ds.Allocated > ss.Allocated+1<<20 {
		t.Fatalf("copy %+v, source %+v: holes not kept", ds, ss)
	}
	if err := CopyScratch(src, dst, nil); err == nil {
		t.Fatal("CopyScratch overwrote an existing file")
	}
	if err := CopyScratch(filepath.Join(dir, "nope"), filepath.Join(dir, "x"), nil); err == nil {
		t.Fatal("missing source accepted")
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Fatal("failed copy left its destination")
	}
}
