package testutil

import (
	"fmt"
	"testing"
)

// ServerLog keeps what an in-process nats-server logs (it has the method
// set of the server's Logger: pass it to SetLoggerV2), and prints it when
// the test fails, so a wait on the server that runs out says what the
// server saw rather than only that it timed out.
type ServerLog struct{ b Buffer }

// KeepServerLog makes a ServerLog printed under name if t fails.
func KeepServerLog(t testing.TB, name string) *ServerLog {
	l := &ServerLog{}
	t.Cleanup(func() {
		if t.Failed() {
			s := l.b.String()
			if len(s) > logTail {
				s = fmt.Sprintf("[%d bytes before]\n", len(s)-logTail) + s[len(s)-logTail:]
			}
			t.Logf("%s's log:\n%s", name, s)
		}
	})
	return l
}

func (l *ServerLog) line(level, format string, v []any) {
	fmt.Fprintf(&l.b, "["+level+"] "+format+"\n", v...)
}

func (l *ServerLog) Noticef(format string, v ...any) { l.line("INF", format, v) }
func (l *ServerLog) Warnf(format string, v ...any)   { l.line("WRN", format, v) }
func (l *ServerLog) Fatalf(format string, v ...any)  { l.line("FTL", format, v) }
func (l *ServerLog) Errorf(format string, v ...any)  { l.line("ERR", format, v) }
func (l *ServerLog) Debugf(format string, v ...any)  { l.line("DBG", format, v) }
func (l *ServerLog) Tracef(format string, v ...any)  { l.line("TRC", format, v) }
