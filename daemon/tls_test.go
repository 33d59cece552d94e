package daemon_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/host/journal"
)

// pki is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, written as PEM files.
type pki struct {
	caFile, certFile, keyFile, clientCert, clientKey string
	pool                                             *x509.CertPool
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nexus test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage, name string) (certPath, keyPath string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, _ := x509.MarshalECPrivateKey(key)
		certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
		writePEM(t, certPath, "CERTIFICATE", der)
		writePEM(t, keyPath, "EC PRIVATE KEY", keyDER)
		return certPath, keyPath
	}
	p := pki{caFile: filepath.Join(dir, "ca.pem"), pool: x509.NewCertPool()}
	writePEM(t, p.caFile, "CERTIFICATE", caDER)
	p.pool.AddCert(ca)
	p.certFile, p.keyFile = leaf(2, x509.ExtKeyUsageServerAuth, "server")
	p.clientCert, p.clientKey = leaf(3, x509.ExtKeyUsageClientAuth, "client")
	return p
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// With --tls-cert/--tls-key the subscriber port speaks only TLS: the URL
// handed to subscribers says tls://, a client trusting the CA reads events,
// and a client speaking plain NATS is turned away.
func TestDaemonSubscribersOverTLS(t *testing.T) {
	p := newPKI(t)
	d := startDaemonWith(t, t.TempDir(), daemon.Options{
		Listen: "127.0.0.1:0",
		TLS:    &journal.TLS{CertFile: p.certFile, KeyFile: p.keyFile},
	})
	creds := readSubscriber(t, d.root)
	if !strings.HasPrefix(creds.URL, "tls://") {
		t.Fatalf("subscriber url %q does not say tls://", creds.URL)
	}
	nc, err := dialSubscriber(t, creds.URL, nats.UserInfo(creds.User, creds.Password),
		nats.Secure(&tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatalf("TLS subscriber: %v", err)
	}
	defer nc.Close()
	if !nc.TLSRequired() {
		t.Fatal("connection is not TLS")
	}
	plain := strings.Replace(creds.URL, "tls://", "nats://", 1)
	if nc, err := nats.Connect(plain, nats.UserInfo(creds.User, creds.Password), nats.NoReconnect(), nats.Timeout(10*time.Second)); err == nil {
		// The client library upgrades when the server demands TLS; it
		// must then fail to verify the test CA it was never given.
		nc.Close()
		t.Fatal("a client that does not trust the CA connected")
	}
}

// With --tls-client-ca a subscriber must also present a certificate from
// that CA.
func TestDaemonSubscribersMutualTLS(t *testing.T) {
	p := newPKI(t)
	d := startDaemonWith(t, t.TempDir(), daemon.Options{
		Listen: "127.0.0.1:0",
		TLS:    &journal.TLS{CertFile: p.certFile, KeyFile: p.keyFile, ClientCA: p.caFile},
	})
	creds := readSubscriber(t, d.root)
	noCert := &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12}
	if nc, err := nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password), nats.Secure(noCert), nats.NoReconnect(), nats.Timeout(10*time.Second)); err == nil {
		nc.Close()
		t.Fatal("a subscriber without a client certificate connected")
	}
	nc, err := dialSubscriber(t, creds.URL, nats.UserInfo(creds.User, creds.Password),
		nats.RootCAs(p.caFile), nats.ClientCert(p.clientCert, p.clientKey))
	if err != nil {
		t.Fatalf("subscriber with a client certificate: %v", err)
	}
	nc.Close()
}
