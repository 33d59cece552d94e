package journal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// serverLog routes the embedded server's log lines to slog and remembers
// its first fatal line. nats-server reports a listener it could not open
// only by logging it (Fatalf) and then never becoming ready; without this
// a busy --listen port looked like a 30-second hang.
type serverLog struct {
	log   *slog.Logger
	once  sync.Once
	ready atomic.Bool
	fatal chan string
	// linkRefused gets the fleet's refusal of the leaf link's credentials,
	// which the server only logs, so Open can fail on it.
	linkRefused chan string
}

var _ server.Logger = (*serverLog)(nil)

func newServerLog(l *slog.Logger) *serverLog {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return &serverLog{log: l.With("component", "nats"), fatal: make(chan string, 1), linkRefused: make(chan string, 1)}
}

// Noticef: the server's notices (ports, limits, versions at start) are
// detail for someone debugging; an operator sees warnings and above.
func (s *serverLog) Noticef(format string, v ...any) {
	s.log.Debug(fmt.Sprintf(format, v...))
}

func (s *serverLog) Warnf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	// The only plaintext password is the internal user's: a random secret
	// made per open, held in memory, valid for in-process connections only.
	if strings.HasPrefix(msg, "Plaintext passwords detected") {
		return
	}
	s.log.Warn(msg)
}

func (s *serverLog) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "Leafnode Error 'Authorization Violation'") {
		select {
		case s.linkRefused <- msg:
		default:
		}
	}
	s.log.Error(msg)
}

func (s *serverLog) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if s.ready.Load() {
		s.log.Error(msg, "fatal", true)
		return
	}
	// Before ready it is not logged: Open returns it and its caller
	// reports it once.
	// A listener failure carries the kernel's error as an argument: that
	// alone ("listen tcp …: bind: address already in use") is the reason.
	for _, a := range v {
		if err, ok := a.(error); ok {
			msg = err.Error()
		}
	}
	s.once.Do(func() { s.fatal <- msg })
}

func (s *serverLog) Debugf(format string, v ...any) {
	s.log.Debug(fmt.Sprintf(format, v...))
}

func (s *serverLog) Tracef(format string, v ...any) {}

// waitReady waits until srv accepts connections, returning at once with
// the server's own reason when it reports a fatal error (a listener it
// could not open) and after limit otherwise.
func (s *serverLog) waitReady(ctx context.Context, srv *server.Server, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if srv.ReadyForConnections(50 * time.Millisecond) {
			s.ready.Store(true)
			return nil
		}
		select {
		case msg := <-s.fatal:
			return errors.New(msg)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("embedded NATS server did not become ready within %s", limit)
		}
	}
}
