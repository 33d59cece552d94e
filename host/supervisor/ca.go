package supervisor

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

const (
	// caLifetime is short because the key sits on disk: if it leaks, its
	// value as a trust anchor must run out within a quarter, not a decade.
	caLifetime = 90 * 24 * time.Hour
	// caBackdate absorbs small clock differences between host and guest.
	caBackdate = time.Minute
	// maxCAFile bounds the read; a real file is well under 2 KiB.
	maxCAFile = 64 << 10

	pemCert = "CERTIFICATE"
	pemKey  = "PRIVATE KEY"
)

// ErrCALost is matched (errors.Is) by every LoadCA failure: the CA on disk
// cannot be used and a fresh one has to be minted, which invalidates the
// trust the guest placed in the old one.
var ErrCALost = errors.New("sandbox MITM CA lost")

// LostError says why and where the CA was lost. Err, when set, is the
// underlying cause (for example fs.ErrNotExist for a file that never
// existed, which a caller may want to tell apart from damage).
type LostError struct {
	Path   string
	Reason string
	Err    error
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("%v: %s: %s", ErrCALost, e.Path, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *LostError) Is(target error) bool { return target == ErrCALost }
func (e *LostError) Unwrap() error        { return e.Err }

// CA is a sandbox's MITM certificate authority.
type CA struct {
	CertPEM []byte
	KeyPEM  []byte
	Cert    *x509.Certificate
}

// Fingerprint is the lowercase hex SHA-256 of the certificate DER.
func (ca *CA) Fingerprint() string {
	sum := sha256.Sum256(ca.Cert.Raw)
	return hex.EncodeToString(sum[:])
}

// Signer parses KeyPEM; it is what issues leaf certificates.
func (ca *CA) Signer() (crypto.Signer, error) {
	_, s, err := parsePair(append(append([]byte(nil), ca.CertPEM...), ca.KeyPEM...))
	if err != nil {
		return nil, fmt.Errorf("supervisor: CA key: %s", err.Reason)
	}
	return s, nil
}

// MintCA creates a self-signed ECDSA P-256 CA for one sandbox, valid from a
// minute before now until 90 days after it.
func MintCA(sandboxID string, now time.Time) (*CA, error) {
	if sandboxID == "" {
		return nil, errors.New("supervisor: mint CA: empty sandbox id")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("supervisor: mint CA: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("supervisor: mint CA: %w", err)
	}
	serial.Add(serial, big.NewInt(1)) // serials must be positive
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "nexus sandbox " + sandboxID + " MITM CA"},
		NotBefore:             now.Add(-caBackdate),
		NotAfter:              now.Add(caLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		// Leaves only: a leaked key must not be able to mint sub-CAs.
		MaxPathLenZero: true,
		KeyUsage:       x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("supervisor: mint CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("supervisor: mint CA: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("supervisor: mint CA: %w", err)
	}
	return &CA{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: pemCert, Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: pemKey, Bytes: keyDER}),
		Cert:    cert,
	}, nil
}

// SaveCA atomically and durably writes dir/mitm-ca.pem (0600). It refuses a
// pair that LoadCA would reject anyway, so a bad CA is caught where it was
// made rather than on the next restart.
func SaveCA(dir string, ca *CA) error {
	if ca == nil {
		return errors.New("supervisor: save CA: nil CA")
	}
	data := make([]byte, 0, len(ca.CertPEM)+len(ca.KeyPEM)+1)
	data = append(data, ca.CertPEM...)
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	data = append(data, ca.KeyPEM...)
	if _, _, lost := parsePair(data); lost != nil {
		return fmt.Errorf("supervisor: save CA: refusing to write: %s", lost.Reason)
	}
	if err := fsx.WriteFile(dir, CAFileName, data, fileMode); err != nil {
		return fmt.Errorf("supervisor: save CA: %w", err)
	}
	return nil
}

// LoadCA reads dir/mitm-ca.pem and fails closed: any doubt about the file
// yields a *LostError (errors.Is ErrCALost) rather than a CA that might be
// half of one pair and half of another, not a CA, or outside its validity.
func LoadCA(dir string, now time.Time) (*CA, error) {
	path := filepath.Join(dir, CAFileName)
	data, lost := readCAFile(path)
	if lost != nil {
		return nil, lost
	}
	cert, signer, lost := parsePair(data)
	if lost != nil {
		lost.Path = path
		return nil, lost
	}
	if now.Before(cert.NotBefore) {
		return nil, &LostError{Path: path, Reason: fmt.Sprintf("certificate not valid until %s (now %s)",
			cert.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))}
	}
	if now.After(cert.NotAfter) {
		return nil, &LostError{Path: path, Reason: fmt.Sprintf("certificate expired at %s (now %s)",
			cert.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))}
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(signer)
	if err != nil {
		return nil, &LostError{Path: path, Reason: "private key does not re-encode", Err: err}
	}
	return &CA{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: pemCert, Bytes: cert.Raw}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: pemKey, Bytes: keyDER}),
		Cert:    cert,
	}, nil
}

// SeedOrMint returns the CA stored in dir or, if it is lost, a freshly
// minted and saved one together with the reason for the loss, so the caller
// can raise a CALost warning: the guest must be told to trust a new CA. Only
// failing to persist the new CA is an error, because serving a CA that is not
// on disk would make the next restart diverge from it.
func SeedOrMint(dir, sandboxID string, now time.Time) (ca *CA, lost error, err error) {
	ca, err = LoadCA(dir, now)
	if err == nil {
		return ca, nil, nil
	}
	if !errors.Is(err, ErrCALost) {
		return nil, nil, err
	}
	lost = err
	ca, err = MintCA(sandboxID, now)
	if err != nil {
		return nil, lost, err
	}
	if err := SaveCA(dir, ca); err != nil {
		return nil, lost, err
	}
	return ca, lost, nil
}

func readCAFile(path string) ([]byte, *LostError) {
	// Through fsx: the key is only trusted from the file we wrote, not from
	// wherever a planted link points, and a FIFO there must not block.
	f, err := fsx.Open(filepath.Dir(path), filepath.Base(path))
	if err != nil {
		reason := "unreadable"
		switch {
		case errors.Is(err, fs.ErrNotExist):
			reason = "absent"
		case errors.Is(err, fsx.ErrSymlink):
			reason = "is a symbolic link"
		case errors.Is(err, fsx.ErrNotRegular):
			reason = "not a regular file"
		}
		return nil, &LostError{Path: path, Reason: reason, Err: err}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, &LostError{Path: path, Reason: "unreadable", Err: err}
	}
	if !fi.Mode().IsRegular() {
		return nil, &LostError{Path: path, Reason: "not a regular file (" + fi.Mode().Type().String() + ")"}
	}
	data, err := io.ReadAll(io.LimitReader(f, maxCAFile+1))
	if err != nil {
		return nil, &LostError{Path: path, Reason: "unreadable", Err: err}
	}
	if len(data) > maxCAFile {
		return nil, &LostError{Path: path, Reason: fmt.Sprintf("larger than %d bytes", maxCAFile)}
	}
	return data, nil
}

// parsePair checks everything about a cert+key file that does not depend on
// the clock. The returned LostError has no Path; callers fill it in.
func parsePair(data []byte) (*x509.Certificate, crypto.Signer, *LostError) {
	lost := func(format string, a ...any) (*x509.Certificate, crypto.Signer, *LostError) {
		return nil, nil, &LostError{Reason: fmt.Sprintf(format, a...)}
	}
	var certBlock, keyBlock *pem.Block
	rest := data
	blocks := 0
	for {
		rest = bytes.TrimLeft(rest, " \t\r\n")
		if len(rest) == 0 {
			break
		}
		// pem.Decode silently skips text before a block; this file is only
		// ever written by SaveCA, so any such text means it was damaged.
		if !bytes.HasPrefix(rest, []byte("-----BEGIN ")) {
			if blocks == 0 {
				return lost("not PEM")
			}
			return lost("unexpected non-PEM data after block %d", blocks)
		}
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return lost("truncated or malformed PEM block %d", blocks+1)
		}
		blocks++
		switch b.Type {
		case pemCert:
			if certBlock != nil {
				return lost("more than one certificate block")
			}
			certBlock = b
		case pemKey:
			if keyBlock != nil {
				return lost("more than one private key block")
			}
			keyBlock = b
		default:
			return lost("unexpected PEM block %q", b.Type)
		}
	}
	switch {
	case certBlock == nil && keyBlock == nil:
		return lost("empty")
	case certBlock == nil:
		return lost("no certificate block (key only)")
	case keyBlock == nil:
		return lost("no private key block (certificate only)")
	}
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return lost("certificate does not parse: %v", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		return lost("private key does not parse: %v", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return lost("private key of type %T cannot sign", k)
	}
	pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return lost("private key does not match the certificate's public key")
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return lost("certificate is not a CA")
	}
	if cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return lost("certificate lacks the cert-sign key usage")
	}
	// Catches a certificate altered after signing that still parses.
	if err := cert.CheckSignatureFrom(cert); err != nil {
		return lost("certificate self-signature does not verify: %v", err)
	}
	return cert, signer, nil
}

// removeStaleTemps deletes temp files fsx.WriteFile left behind when a
// crash interrupted a SaveCA: they may hold a private key, and nothing will
// ever rename them into place.
func removeStaleTemps(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := "." + CAFileName + ".tmp-"
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
