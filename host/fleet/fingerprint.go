package fleet

import (
	"os"

	"github.com/nexus-sandbox/nexus/host/fleetstate"
)

// FromSettings is a Mirror with the settings s.
func FromSettings(s fleetstate.Settings) *Mirror {
	return &Mirror{URLs: s.URLs, Credentials: s.Credentials, Domain: s.Domain, Host: s.Host, Replicas: s.Replicas, MaxBytes: s.MaxBytes}
}

// Settings are the settings m mirrors with.
func (m *Mirror) Settings() fleetstate.Settings {
	return fleetstate.Settings{URLs: m.URLs, Credentials: m.Credentials, Domain: m.Domain, Host: m.Host, Replicas: m.Replicas, MaxBytes: m.MaxBytes}
}

// Fingerprint is the fingerprint of m's settings (fleetstate.Settings),
// its credentials file read now. A nil Mirror (no mirroring) has the empty
// one.
func (m *Mirror) Fingerprint() string {
	if m == nil {
		return ""
	}
	s := m.Settings()
	return s.Fingerprint(readCredentials(s.Credentials))
}

// readCredentials is a credentials file's content for a fingerprint, nil
// when there is none or it cannot be read.
func readCredentials(path string) []byte {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return b
}
