package imagecache

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nexus-sandbox/nexus/layout"
)

// FuzzReadIdentity: an identity.json a crash tore or someone edited reads
// as the entry's identity or as an error, never a panic, and never as the
// identity of another entry (a mismatched cache id is refused).
func FuzzReadIdentity(f *testing.F) {
	const id = "img-77fbcd4b64ce7a46b6171c73"
	f.Add([]byte(`{"cache_id":"` + id + `","image_ref":"/img","identity":"x","layout_version":1,"prepared_ms":1}`))
	f.Add([]byte(`{"cache_id":"img-000000000000000000000000"}`))
	f.Add([]byte(`{"layout_version":"1"}`))
	f.Add([]byte{})
	root := layout.Root(f.TempDir())
	if err := os.MkdirAll(root.ImageEntry(id), 0o700); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(filepath.Join(root.ImageEntry(id), layout.ImageIdentityName), data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadIdentity(root, id)
		if err == nil && got.CacheID != id {
			t.Fatalf("read the identity of %q from %s's entry", got.CacheID, id)
		}
	})
}
