// Package daemon is the process that owns a state root for every command:
// it keeps the journal open, serves the control protocol (control/wire) on
// the root's socket, journals the exits of the processes it records as
// running and the fleet mirror's changes, finishes the sagas a dead runner
// left open before it serves, and, when started on demand, exits when idle
// or retires for a command that needs the journal itself.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/hostid"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/store"
)

// SubscriberFile holds the external subscribers' credentials, 0600, under
// the state root. It is generated on the first start with --listen.
const SubscriberFile = "subscriber.json"

// SubscriberCredentials is the content of SubscriberFile.
type SubscriberCredentials struct {
	User     string `json:"user"`
	Password string `json:"password"`
	URL      string `json:"url,omitempty"`
	Subjects string `json:"subjects"`
	// History is where to ask for missed events, with a reply inbox under
	// InboxPrefix (docs/events.md); set on every start, not stored state.
	History     string `json:"history"`
	InboxPrefix string `json:"inbox_prefix"`
}

// TLS is the listener's certificate and key (and client CA, for mutual
// TLS), as the journal's server takes them.
type TLS = journal.TLS

// Options configure Run.
type Options struct {
	// Listen exposes NATS to subscribers on this TCP address ("" = none).
	Listen string
	// MetricsListen also serves the Prometheus metrics (served on the
	// control socket at wire.PathMetrics) on this TCP address ("" = none).
	MetricsListen string
	// AllowRemote permits a Listen address that is not loopback; such an
	// address also needs TLS.
	AllowRemote bool
	// TLS makes the Listen port TLS-only (and, with a client CA, mutual).
	TLS *TLS
	// Mirror, if set, replicates the journal to a fleet's JetStream.
	Mirror *fleet.Mirror
	// DigestEvery and DigestInterval space a mirroring daemon's
	// journal.digest events: after that many events, or that long with
	// any (0: 1000 events, 1 minute).
	DigestEvery    int
	DigestInterval time.Duration
	// LockWait is how long to wait for a command that holds the journal.
	LockWait time.Duration
	// Ready, if set, is called once the daemon serves its socket, after
	// its start-up lines are logged.
	Ready func(wire.Status)
	// Idle > 0 stops the daemon once no client has been connected for that
	// long (0: serve until ctx is done).
	Idle time.Duration
	// Auto marks a daemon a command started on demand.
	Auto bool
	// Logger receives the daemon's own lines ("serving" once a client can
	// connect, then how start-up went) and the embedded NATS server's
	// warnings and errors; nil discards them.
	Logger *slog.Logger
	// Manager, if set, makes the flows' manager over the daemon's store:
	// once the journal is open and before the socket serves, the daemon
	// finishes with it the sagas a dead runner (or a killed daemon) left
	// open, under their free runner leases.
	Manager func(control.Backend) (*lifecycle.Manager, error)
	// BeforeJournal, if set, runs before the journal's open behind the
	// early reads (store.Options.BeforeJournal): the tests hold it there.
	BeforeJournal func()
}

// Run owns the state root until ctx is done: it keeps the journal
// open, finishes interrupted sagas, serves commands on the control socket
// and, if asked, subscribers. A daemon started on demand that finds
// another serving the root is not needed: it says so and returns nil.
func Run(ctx context.Context, root string, o Options) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	root, err := store.PrepareRoot(root)
	if err != nil {
		return err
	}
	// The build is the executable as it was at start: identified now,
	// before anything could replace the file this process runs.
	control.SelfBuild()
	if o.Mirror != nil && o.Mirror.HostID == "" {
		id, err := hostid.Load(root)
		if err != nil {
			return err
		}
		o.Mirror.HostID = id.String()
	}
	jo := journal.Options{Logger: o.Logger}
	if o.Mirror != nil {
		jo.Mirror = o.Mirror
	}
	var creds *SubscriberCredentials
	if o.Listen != "" {
		if err := checkListen(o.Listen, o.AllowRemote, o.TLS != nil); err != nil {
			return err
		}
		if creds, err = loadOrCreateSubscriber(root); err != nil {
			return err
		}
		// The hash only keeps the clear password out of the server's memory
		// (the password itself sits in a 0600 file); a high cost buys nothing
		// and makes every subscriber handshake slow enough, under load, for
		// the server to ping before it answers the client's connect.
		hash, err := bcrypt.GenerateFromPassword([]byte(creds.Password), bcrypt.MinCost)
		if err != nil {
			return err
		}
		jo.Listen = o.Listen
		jo.TLS = o.TLS
		jo.Subscriber = &journal.Credentials{User: creds.User, PasswordHash: string(hash)}
	}
	m := newMetrics()
	// Without a listener or a mirror nothing of the journal is needed
	// to answer the reads of the sandbox store, which then come first.
	early := o.Listen == "" && o.Mirror == nil
	n, err := openWaiting(ctx, root, store.Options{Journal: jo, Observer: m, Early: early, BeforeJournal: o.BeforeJournal}, o.LockWait, !o.Auto)
	if errors.Is(err, errServedElsewhere) {
		log.Info("not needed", "reason", err.Error())
		return nil
	}
	if err != nil {
		return err
	}
	defer n.Close()
	m.reg.MustRegister(newStoreCollector(n, o.Mirror))
	if o.MetricsListen != "" {
		addr, stop, err := serveMetrics(ctx, o.MetricsListen, m)
		if err != nil {
			return err
		}
		defer stop()
		log.Info("metrics", "url", "http://"+addr+wire.PathMetrics)
	}
	if creds != nil {
		creds.URL = n.Journal().ClientURL()
		if err := writeSubscriber(root, creds); err != nil {
			return err
		}
	}
	// The sagas a dead runner left are finished before any command but
	// the early reads is served: before serving at all, unless the store
	// opened early, and then once its journal is open.
	var recovered func()
	recoverOnce := func() {
		if o.Manager != nil {
			recovered = recoverSagas(ctx, log, o.Manager, local.Backend{Store: n})
		}
	}
	var op *opening
	if n.Early() {
		op = newOpening()
	} else {
		recoverOnce()
	}
	served := make(chan error, 1)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		served <- serve(sctx, n, serveOptions{idle: o.Idle, auto: o.Auto, mirror: o.Mirror, log: log, metrics: m, opening: op})
	}()
	if n.Early() {
		log.Info("answering reads of the sandbox store while the journal opens", "root", root, "pid", os.Getpid())
		start := time.Now()
		opened := make(chan error, 1)
		go func() { opened <- n.Opened(sctx) }()
		select {
		case err := <-served:
			return err
		case err := <-opened:
			if err != nil {
				// Every command, waiting or still to ask, is told why;
				// serve stops accepting and returns once they are.
				log.Error("the journal did not open behind the early reads", "err", err.Error())
				op.fail(err)
				<-served
				return err
			}
		}
		log.Info("journal open", "took", time.Since(start).Round(time.Millisecond).String())
		recoverOnce()
		op.opened()
	}
	// Exits are facts (exits.go): stopped before the store closes.
	defer watchExits(sctx, n)()
	defer journalMirror(sctx, n, o.Mirror)()
	if o.Mirror != nil {
		defer journalDigests(sctx, n, o.DigestEvery, o.DigestInterval)()
	}
	// Serve creates the socket almost at once; wait until it answers so
	// "serving" (and Ready) means a client can connect.
	if err := waitAnswering(ctx, filepath.Join(root, wire.SocketName), served); err != nil {
		return err
	}
	// Set once the daemon serves: the collection the limit may start
	// then runs beside the first command instead of before it.
	defer holdMemory(ctx)()
	st := wire.Status{Pid: os.Getpid(), Root: root, SubscriberURL: n.Journal().ClientURL(), Auto: o.Auto, Build: buildRef(), Fleet: o.Mirror.Fingerprint()}
	log.Info("serving", "root", st.Root, "pid", st.Pid, "auto", st.Auto)
	if recovered != nil {
		recovered()
	}
	if m := o.Mirror; m != nil {
		log.Info("mirroring", "stream", m.StreamName(), "domain", m.Domain, "host", m.Host, "host_id", m.HostID, "urls", strings.Join(m.Redacted(), ","))
	}
	if st.SubscriberURL != "" {
		log.Info("subscribers", "url", st.SubscriberURL, "credentials", filepath.Join(root, SubscriberFile))
	}
	if o.Ready != nil {
		o.Ready(st)
	}
	// A host whose mirror the fleet says is another's stops, with the
	// same error whether the fleet said so before Open returned or later.
	var refused <-chan struct{}
	if o.Mirror != nil {
		refused, _ = o.Mirror.Refused()
	}
	select {
	case err := <-served:
		return err
	case <-refused:
		cancel()
		<-served
		_, err := o.Mirror.Refused()
		return err
	}
}

// errServedElsewhere is a daemon started on demand that found another
// daemon serving the root while it waited for the journal.
var errServedElsewhere = errors.New("another daemon serves the state root")

// openWaiting opens the store, waiting up to wait for a holder of the
// journal to let go. A daemon started by hand (takeOver) asks a daemon
// started on demand to retire, so `nexus daemon` works whatever commands
// ran before it.
func openWaiting(ctx context.Context, root string, so store.Options, wait time.Duration, takeOver bool) (*store.Store, error) {
	deadline := time.Now().Add(wait)
	for {
		n, err := store.Open(ctx, root, so)
		if !errors.Is(err, journal.ErrLocked) || time.Now().After(deadline) {
			return n, err
		}
		if c, err := control.Dial(ctx, filepath.Join(root, wire.SocketName)); err == nil {
			st, serr := c.Status(ctx)
			switch {
			case takeOver && serr == nil && st.Auto:
				c.Retire(ctx)
			case !takeOver:
				// Started on demand while another daemon took the root
				// (one started by hand): the command that started us is
				// served by it, so we are not needed.
				c.Close()
				return nil, errServedElsewhere
			}
			c.Close()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func waitAnswering(ctx context.Context, sock string, served <-chan error) error {
	for {
		if c, err := control.Dial(ctx, sock); err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-served:
			return fmt.Errorf("control socket: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// checkListen refuses a listener beyond loopback unless asked for, and
// then only with TLS: subscribers' passwords and every event would
// otherwise cross the network in clear.
func checkListen(addr string, allowRemote, withTLS bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	if !allowRemote {
		return fmt.Errorf("--listen %q is not a loopback address (pass --allow-remote, with --tls-cert and --tls-key, to expose the journal beyond this host)", addr)
	}
	if !withTLS {
		return fmt.Errorf("--listen %q beyond loopback needs --tls-cert and --tls-key (subscribers' passwords and events would cross the network in clear)", addr)
	}
	return nil
}

func loadOrCreateSubscriber(root string) (*SubscriberCredentials, error) {
	path := filepath.Join(root, SubscriberFile)
	data, err := fsx.ReadFile(root, SubscriberFile)
	if err == nil {
		var c SubscriberCredentials
		if err := json.Unmarshal(data, &c); err != nil || c.User == "" || c.Password == "" {
			return nil, fmt.Errorf("%s is damaged; remove it to generate new credentials", path)
		}
		c.Subjects, c.History, c.InboxPrefix = journal.Subjects, journal.HistorySubject, journal.ReplyPrefix
		return &c, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	pw, err := journal.RandomSecret()
	if err != nil {
		return nil, err
	}
	c := &SubscriberCredentials{User: "subscriber", Password: pw, Subjects: journal.Subjects,
		History: journal.HistorySubject, InboxPrefix: journal.ReplyPrefix}
	return c, writeSubscriber(root, c)
}

func writeSubscriber(root string, c *SubscriberCredentials) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return fsx.WriteFile(root, SubscriberFile, append(data, '\n'), 0o600)
}
