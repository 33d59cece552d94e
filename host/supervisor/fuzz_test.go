package supervisor

import (
	"testing"
	"time"
)

// FuzzParsePair: whatever bytes sit in mitm-ca.pem, loading them yields a
// CA or a LostError (so a replacement supervisor mints afresh and says so),
// never a panic.
func FuzzParsePair(f *testing.F) {
	ca, err := MintCA("01JABCDEFGHJKMNPQRSTVWXYZ0", time.Now())
	if err != nil {
		f.Fatal(err)
	}
	dir := f.TempDir()
	if err := SaveCA(dir, ca); err != nil {
		f.Fatal(err)
	}
	good, lost := readCAFile(dir + "/" + CAFileName)
	if lost != nil {
		f.Fatal(lost)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cert, key, lost := parsePair(data)
		if lost == nil && (cert == nil || key == nil) {
			t.Fatal("parsePair returned neither a pair nor a LostError")
		}
	})
}
