package journal

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// internalUser is nexus's own identity; it may only connect in process, so
// a TCP listener never exposes it.
const internalUser = "nexus"

// maxStore is JetStream's store limit: never the binding one (Space is).
const maxStore = 1 << 50

func randomSecret() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("journal: random secret: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// RandomSecret is a fresh password for a subscriber identity.
func RandomSecret() (string, error) { return randomSecret() }

func serverOptions(dir string, opts Options, internalPass string) (*server.Options, error) {
	so := &server.Options{
		ServerName: "nexus-journal",
		JetStream:  true,
		StoreDir:   dir,
		// Every append is fsynced before it is acknowledged, by the
		// journal itself so that appends published together share one
		// fsync (sync.go). The server's own periodic sync stays on as a
		// backstop; SyncAlways would fsync every message on its own.
		SyncAlways: testSyncAlways,
		// A fixed limit: left unset, the server caps the store at 75% of
		// the space free when it starts, and a journal that outgrows that
		// cap is refused ("insufficient resources") until a restart, even
		// once space is freed. Free space is the journal's own check.
		JetStreamMaxStore: maxStore,
		DontListen:        opts.Listen == "",
		NoLog:             true,
		NoSigs:            true,
		AuthTimeout:       slowHostTimeout.Seconds(),
		// The server pings a new client 2 s after it connects; a
		// handshake that a loaded host has not finished by then reads that
		// PING where it expects its PONG and fails. The regular interval
		// (minutes) still finds a dead client.
		DisableShortFirstPing: true,
		Users: []*server.User{{
			Username:               internalUser,
			Password:               internalPass,
			AllowedConnectionTypes: map[string]struct{}{jwt.ConnectionTypeInProcess: {}},
		}},
	}
	if m := opts.Mirror; m != nil {
		leaf, err := m.Leaf()
		if err != nil {
			return nil, err
		}
		so.ServerName = leaf.ServerName
		so.JetStreamDomain = leaf.Domain
		so.LeafNode.Remotes = []*server.RemoteLeafOpts{leafRemote(leaf)}
	}
	if opts.Listen == "" {
		return so, nil
	}
	if opts.Subscriber == nil {
		return nil, errors.New("journal: a listener needs subscriber credentials")
	}
	host, port, err := net.SplitHostPort(opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("journal: --listen %q: %w", opts.Listen, err)
	}
	so.Host = host
	if so.Port, err = strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("journal: --listen %q: bad port", opts.Listen)
	}
	if so.Port == 0 {
		so.Port = server.RANDOM_PORT
	}
	if t := opts.TLS; t != nil {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: t.CertFile, KeyFile: t.KeyFile,
			CaFile: t.ClientCA, Verify: t.ClientCA != "",
			MinVersion: tls.VersionTLS12,
		})
		if err != nil {
			return nil, fmt.Errorf("journal: --listen %s: TLS: %w", opts.Listen, err)
		}
		so.TLSConfig = tc
		so.TLSVerify = t.ClientCA != ""
		so.TLSTimeout = 5
	}
	// Subscribers read, never write: live events (stored ones, republished
	// with their sequence; appends travel on appendSubjects), and history
	// through nexus's own read-only service, answered on their inbox prefix.
	// They publish only history requests, so they can neither append nor
	// reach the JetStream API (stream delete, purge, consumers of any kind).
	so.Users = append(so.Users, &server.User{
		Username: opts.Subscriber.User,
		Password: opts.Subscriber.PasswordHash,
		Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{HistorySubject}},
			Subscribe: &server.SubjectPermission{Allow: []string{Subjects, ReplyPrefix + ".>"}},
		},
		AllowedConnectionTypes: map[string]struct{}{jwt.ConnectionTypeStandard: {}},
	})
	return so, nil
}
