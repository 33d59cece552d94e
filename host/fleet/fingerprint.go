package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
)

// Fingerprint names the settings a mirror runs with: its URLs (with their
// passwords), credentials file and that file's content, domain, host name,
// replicas and byte limit. Two mirrors with one fingerprint link and
// mirror alike; a daemon whose fingerprint is not the one its
// configuration gives is running stale settings. It is a digest, so it
// repeats no password. A nil Mirror (no mirroring) has the empty one.
func (m *Mirror) Fingerprint() string {
	if m == nil {
		return ""
	}
	h := sha256.New()
	for _, u := range m.URLs {
		fmt.Fprintf(h, "url %q\n", u.String())
	}
	fmt.Fprintf(h, "creds %q\n", m.Credentials)
	if m.Credentials != "" {
		// A rotated credentials file is a new setting: a daemon still
		// linked with the old one is stale.
		if b, err := os.ReadFile(m.Credentials); err == nil {
			fmt.Fprintf(h, "creds-content %x\n", sha256.Sum256(b))
		}
	}
	fmt.Fprintf(h, "domain %q\nhost %q\nreplicas %d\nmax-bytes %d\n", m.Domain, m.Host, m.Replicas, m.MaxBytes)
	return hex.EncodeToString(h.Sum(nil)[:12])
}
