package supervisor

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// timeNow is fixed so validity windows are exact; x509 keeps whole seconds.
func timeNow() time.Time { return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) }

func newStateDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "S")
	if err := EnsureStateDir(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestMintCA(t *testing.T) {
	now := timeNow()
	ca, err := MintCA("01TESTSANDBOX", now)
	if err != nil {
		t.Fatal(err)
	}
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Fatalf("not a CA: IsCA=%v BCV=%v KU=%v", c.IsCA, c.BasicConstraintsValid, c.KeyUsage)
	}
	if c.Subject.CommonName != "nexus sandbox 01TESTSANDBOX MITM CA" {
		t.Fatalf("CN %q", c.Subject.CommonName)
	}
	if !c.NotBefore.Equal(now.Add(-time.Minute)) || !c.NotAfter.Equal(now.Add(90*24*time.Hour)) {
		t.Fatalf("validity %v..%v", c.NotBefore, c.NotAfter)
	}
	pub, ok := c.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Fatalf("key %T, want ECDSA P-256", c.PublicKey)
	}
	if c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Fatalf("CA may issue sub-CAs: MaxPathLen=%d", c.MaxPathLen)
	}
	// The key must actually issue leaves the CA verifies.
	signer, err := ca.Signer()
	if err != nil {
		t.Fatal(err)
	}
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "example.com"},
		DNSNames: []string{"example.com"}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, c, &leafKey.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(leafDER)
	roots := x509.NewCertPool()
	roots.AddCert(c)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "example.com", CurrentTime: now}); err != nil {
		t.Fatalf("leaf does not verify: %v", err)
	}
}

func TestCARoundTrip(t *testing.T) {
	dir := newStateDir(t)
	now := timeNow()
	ca, err := MintCA("S", now)
	if err != nil {
		t.Fatal(err)
	}
	if err := SaveCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, filepath.Join(dir, CAFileName)); m != 0o600 {
		t.Fatalf("CA file mode %v, want 0600", m)
	}
	got, err := LoadCA(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if got.Fingerprint() != ca.Fingerprint() {
		t.Fatalf("fingerprint %s, want %s", got.Fingerprint(), ca.Fingerprint())
	}
	if !bytes.Equal(got.CertPEM, ca.CertPEM) || !bytes.Equal(got.KeyPEM, ca.KeyPEM) {
		t.Fatal("PEM differs after round trip")
	}
	// Both ends of the validity window are inclusive.
	for _, at := range []time.Time{now.Add(-time.Minute), now.Add(90 * 24 * time.Hour)} {
		if _, err := LoadCA(dir, at); err != nil {
			t.Fatalf("at %v: %v", at, err)
		}
	}
	// No temp files left beside it.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("dir holds %v", entries)
	}
}

func TestSaveCARefusesMismatchedPair(t *testing.T) {
	a, _ := MintCA("A", timeNow())
	b, _ := MintCA("B", timeNow())
	dir := newStateDir(t)
	if err := SaveCA(dir, &CA{CertPEM: a.CertPEM, KeyPEM: b.KeyPEM, Cert: a.Cert}); err == nil {
		t.Fatal("SaveCA wrote a cert with another CA's key")
	}
	if _, err := os.Lstat(filepath.Join(dir, CAFileName)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("file written despite refusal")
	}
}

// leafPair is a well-formed cert+key whose cert is not a CA.
func leafPair(t *testing.T, now time.Time) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "not a ca"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		BasicConstraintsValid: true, IsCA: false,
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})...)
}

func TestLoadCAFailsClosed(t *testing.T) {
	now := timeNow()
	good, _ := MintCA("S", now)
	other, _ := MintCA("OTHER", now)
	full := append(append([]byte(nil), good.CertPEM...), good.KeyPEM...)
	flipped := bytes.Clone(good.Cert.Raw)
	flipped[len(flipped)-3] ^= 0x01 // inside the signature: still parses
	cases := []struct {
		name   string
		data   []byte // nil: no file at all
		at     time.Time
		reason string
	}{
		{"absent", nil, now, "absent"},
		{"empty", []byte{}, now, "empty"},
		{"garbage", []byte("this is not a certificate\n"), now, "not PEM"},
		{"truncated", full[:len(full)/2], now, "truncated"},
		{"truncated in cert", full[:len(good.CertPEM)/2], now, "truncated"},
		{"cert only", good.CertPEM, now, "certificate only"},
		{"key only", good.KeyPEM, now, "key only"},
		{"key of another CA", append(bytes.Clone(good.CertPEM), other.KeyPEM...), now, "does not match"},
		{"two certs", append(append(bytes.Clone(good.CertPEM), other.CertPEM...), good.KeyPEM...), now, "more than one certificate"},
		{"trailing junk", append(bytes.Clone(full), "junk"...), now, "non-PEM"},
		{"leading junk", append([]byte("junk\n"), full...), now, "not PEM"},
		{"not a CA", leafPair(t, now), now, "not a CA"},
		{"tampered cert", append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: flipped}), good.KeyPEM...), now, "signature"},
		{"expired", full, now.Add(91 * 24 * time.Hour), "expired"},
		{"not yet valid", full, now.Add(-2 * time.Minute), "not valid until"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := newStateDir(t)
			path := filepath.Join(dir, CAFileName)
			if tc.data != nil {
				if err := os.WriteFile(path, tc.data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ca, err := LoadCA(dir, tc.at)
			if !errors.Is(err, ErrCALost) {
				t.Fatalf("LoadCA = %v, %v; want ErrCALost", ca, err)
			}
			var le *LostError
			if !errors.As(err, &le) || le.Path != path {
				t.Fatalf("error %v does not carry path %s", err, path)
			}
			msg := err.Error()
			if !strings.Contains(msg, path) || !strings.Contains(msg, tc.reason) {
				t.Fatalf("message %q should name path and %q", msg, tc.reason)
			}
		})
	}
}

func TestLoadCAAbsentIsNotExist(t *testing.T) {
	_, err := LoadCA(newStateDir(t), timeNow())
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v; want it to unwrap to fs.ErrNotExist", err)
	}
}

func TestLoadCARefusesSymlink(t *testing.T) {
	now := timeNow()
	src := newStateDir(t)
	ca, _ := MintCA("S", now)
	SaveCA(src, ca)
	dir := newStateDir(t)
	os.Symlink(filepath.Join(src, CAFileName), filepath.Join(dir, CAFileName))
	if _, err := LoadCA(dir, now); !errors.Is(err, ErrCALost) {
		t.Fatalf("err = %v, want ErrCALost for a symlinked CA file", err)
	}
}

// A FIFO planted at the CA's name must be a lost CA at once: a blocking
// open would hang every start and fork.
func TestLoadCARefusesFIFO(t *testing.T) {
	dir := newStateDir(t)
	if err := syscall.Mkfifo(filepath.Join(dir, CAFileName), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadCA(dir, timeNow())
	if !errors.Is(err, ErrCALost) || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("err = %v, want ErrCALost naming a non-regular file", err)
	}
}

func TestLoadCAUnreadable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads mode-0000 files")
	}
	now := timeNow()
	dir := newStateDir(t)
	ca, _ := MintCA("S", now)
	SaveCA(dir, ca)
	os.Chmod(filepath.Join(dir, CAFileName), 0)
	_, err := LoadCA(dir, now)
	if !errors.Is(err, ErrCALost) || !strings.Contains(err.Error(), "unreadable") {
		t.Fatalf("err = %v, want ErrCALost naming unreadable", err)
	}
}

func TestSeedOrMint(t *testing.T) {
	now := timeNow()
	dir := newStateDir(t)

	first, lost, err := SeedOrMint(dir, "S", now)
	if err != nil || first == nil {
		t.Fatal(err)
	}
	if !errors.Is(lost, ErrCALost) || !errors.Is(lost, fs.ErrNotExist) {
		t.Fatalf("first boot lost = %v, want ErrCALost wrapping fs.ErrNotExist", lost)
	}

	again, lost, err := SeedOrMint(dir, "S", now.Add(time.Hour))
	if err != nil || lost != nil {
		t.Fatalf("re-seed: lost=%v err=%v", lost, err)
	}
	if again.Fingerprint() != first.Fingerprint() {
		t.Fatal("re-seed changed the CA")
	}

	path := filepath.Join(dir, CAFileName)
	data, _ := os.ReadFile(path)
	os.WriteFile(path, data[:len(data)/2], 0o600)
	fresh, lost, err := SeedOrMint(dir, "S", now)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(lost, ErrCALost) || !strings.Contains(lost.Error(), "truncated") {
		t.Fatalf("lost = %v, want truncation reason", lost)
	}
	if fresh.Fingerprint() == first.Fingerprint() {
		t.Fatal("damaged CA was not replaced")
	}
	loaded, err := LoadCA(dir, now)
	if err != nil {
		t.Fatalf("fresh CA does not load: %v", err)
	}
	if loaded.Fingerprint() != fresh.Fingerprint() {
		t.Fatal("file on disk is not the CA SeedOrMint returned")
	}
	if m := mode(t, path); m != 0o600 {
		t.Fatalf("mode %v", m)
	}

	// Expiry is a loss too: that is how the 90-day CA rotates.
	later := now.Add(91 * 24 * time.Hour)
	rotated, lost, err := SeedOrMint(dir, "S", later)
	if err != nil || !errors.Is(lost, ErrCALost) || rotated.Fingerprint() == fresh.Fingerprint() {
		t.Fatalf("expired CA not rotated: lost=%v err=%v", lost, err)
	}
	if _, err := LoadCA(dir, later); err != nil {
		t.Fatal(err)
	}
}

func TestSeedOrMintSaveFailure(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no", "such", "dir")
	ca, lost, err := SeedOrMint(missing, "S", timeNow())
	if err == nil || ca != nil {
		t.Fatalf("SeedOrMint into a missing dir: ca=%v err=%v", ca, err)
	}
	if !errors.Is(lost, ErrCALost) {
		t.Fatalf("lost = %v", lost)
	}
}
