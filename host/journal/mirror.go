package journal

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Mirror configures replication of the journal to a stream on an existing
// NATS JetStream deployment (the fleet's audit store), so one place holds
// the events of many hosts.
//
// It is JetStream's own mirroring, not a copier: the embedded server joins
// the fleet as a leaf node in its own JetStream domain, and a mirror stream
// created on the fleet side pulls from the journal through that link. The
// fleet keeps its position, so events appended while the link is down
// arrive, in order and once each, when it is back.
type Mirror struct {
	// URL is the fleet's leaf-node endpoint (nats-leaf://, nats:// or
	// tls://), with user:password in it if the fleet wants them.
	URL *url.URL
	// Credentials is a NATS .creds file for the link, or "".
	Credentials string
	// Domain is the fleet's JetStream domain, where the mirror stream is made.
	Domain string
	// Host names this host: the local domain is "nexus-<host>", the mirror
	// stream "NEXUS_<HOST>", and every mirrored subject is prefixed "<host>.".
	Host string
}

var hostToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (m *Mirror) validate() error {
	if m.URL == nil || m.URL.Host == "" {
		return errors.New("journal: mirror needs a URL with a host")
	}
	if !hostToken.MatchString(m.Host) {
		return fmt.Errorf("journal: mirror host name %q: want 1-64 letters, digits, '-' or '_'", m.Host)
	}
	if !hostToken.MatchString(m.Domain) {
		return fmt.Errorf("journal: mirror domain %q: want 1-64 letters, digits, '-' or '_'", m.Domain)
	}
	return nil
}

func (m *Mirror) localDomain() string { return "nexus-" + m.Host }

// StreamName is the mirror stream's name on the fleet.
func (m *Mirror) StreamName() string {
	return StreamName + "_" + strings.ToUpper(strings.ReplaceAll(m.Host, "-", "_"))
}

// deniedFromFleet is every subject the fleet may not send into this
// server: appends to the journal, and each JetStream API call that writes
// or deletes. Reads and the consumers a mirror needs stay open; the fleet
// can see the journal, never change it.
func deniedFromFleet(domain string) []string {
	deny := []string{Subjects, appendSubjects, "$SYS.>", "$JS.API.>"}
	for _, api := range []string{
		"STREAM.CREATE.>", "STREAM.UPDATE.>", "STREAM.DELETE.>", "STREAM.PURGE.>",
		"STREAM.MSG.DELETE.>", "STREAM.SNAPSHOT.>", "STREAM.RESTORE.>", "STREAM.PEER.>",
		"STREAM.LEADER.>", "CONSUMER.DELETE.>", "CONSUMER.PAUSE.>", "CONSUMER.UNPIN.>",
		"ACCOUNT.>", "META.>", "SERVER.>",
	} {
		deny = append(deny, "$JS."+domain+".API."+api)
	}
	return deny
}

// leafRemote is the embedded server's side of the link.
func (m *Mirror) leafRemote() *server.RemoteLeafOpts {
	return &server.RemoteLeafOpts{
		URLs:        []*url.URL{m.URL},
		Credentials: m.Credentials,
		DenyImports: deniedFromFleet(m.localDomain()),
	}
}

// mirrorRetry spaces attempts to create the mirror stream while the fleet
// is unreachable.
const mirrorRetry = 2 * time.Second

// keepMirror creates (or updates) the mirror stream on the fleet, retrying
// until it succeeds or ctx ends. Once it exists the fleet does the rest.
func (j *Journal) keepMirror(ctx context.Context, m *Mirror) {
	fleet, err := jetstream.NewWithDomain(j.nc, m.Domain)
	if err != nil {
		j.setMirrorErr(err)
		return
	}
	cfg := jetstream.StreamConfig{
		Name:    m.StreamName(),
		Storage: jetstream.FileStorage,
		Mirror: &jetstream.StreamSource{
			Name:              StreamName,
			Domain:            m.localDomain(),
			SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: ">", Destination: m.Host + ".>"}},
		},
		DenyDelete: true,
		DenyPurge:  true,
	}
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := fleet.CreateOrUpdateStream(actx, cfg)
		cancel()
		j.setMirrorErr(err)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(mirrorRetry):
		}
	}
}

func (j *Journal) setMirrorErr(err error) {
	j.mirrorMu.Lock()
	defer j.mirrorMu.Unlock()
	j.mirrorErr, j.mirrorSet = err, true
}

// MirrorStatus reports whether the mirror stream exists on the fleet yet:
// ok once created; otherwise the last error ("" before the first attempt).
func (j *Journal) MirrorStatus() (ok bool, lastErr string) {
	j.mirrorMu.Lock()
	defer j.mirrorMu.Unlock()
	if j.mirrorErr != nil {
		return false, j.mirrorErr.Error()
	}
	return j.mirrorSet, ""
}

// ReadMirror reads every record of a mirror stream on the fleet (or any
// JetStream holding nexus events) at natsURL, in order, for replay. It only
// reads: an ordered consumer, nothing acknowledged or deleted. Subjects
// keep the mirror's host prefix.
func ReadMirror(ctx context.Context, natsURL, credsFile, stream string, fn func(Record) error) error {
	opts := []nats.Option{nats.Name("nexus replay")}
	if credsFile != "" {
		opts = append(opts, nats.UserCredentials(credsFile))
	}
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return fmt.Errorf("journal: connect to %s: %w", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("journal: stream %s at %s: %w", stream, natsURL, err)
	}
	return scan(ctx, s, Range{}, nil, fn)
}
