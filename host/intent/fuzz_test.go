package intent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRead: a marker a crash tore or someone wrote by hand reads as an
// Intent or as ErrUnreadable (which the reaper must treat as "keep"), never
// as a panic or any other error.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"schema":1,"kind":"create","sandbox":"01JABCDEFGHJKMNPQRSTVWXYZ0","saga":"s","covers":["disks/01JABCDEFGHJKMNPQRSTVWXYZ0.raw"],"pid":1}`))
	f.Add([]byte(`{"schema":99}`))
	f.Add([]byte(`{"covers":[1,2]}`))
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "m.create-intent.json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		in, err := Read(path)
		if err != nil {
			if !errors.Is(err, ErrUnreadable) {
				t.Fatalf("Read error %v is not ErrUnreadable", err)
			}
			return
		}
		if in.Schema > SchemaVersion {
			t.Fatalf("accepted schema %d", in.Schema)
		}
	})
}
