package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/store"
)

// logMessages are the msg fields of the JSON lines in log, in order.
func logMessages(t *testing.T, log *testutil.Buffer) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		var rec struct{ Msg string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, rec.Msg)
	}
	return out
}

// openReapSaga leaves root's journal with a reap saga open and no runner,
// as a reap killed halfway does.
func openReapSaga(t *testing.T, root string) {
	t.Helper()
	ctx := context.Background()
	n, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	e := events.New(ulid.Make(), time.Now().UTC(), "", events.SagaStartedEvent{Kind: events.SagaReap})
	e.Saga = ulid.Make().String()
	if _, err := n.Append(ctx, e); err != nil {
		t.Fatal(err)
	}
}

// TestStartFinishesDeadSagas: a saga whose runner is gone is finished
// before the daemon serves, and the daemon says so after "serving" (the
// line callers wait for); a recovery that fails leaves the daemon serving
// and says to run recover.
func TestStartFinishesDeadSagas(t *testing.T) {
	for _, c := range []struct {
		name     string
		fail     error
		wantOpen int
		wantLine string
	}{
		{name: "finished", wantLine: "finished interrupted sagas"},
		{name: "failed", fail: errors.New("no manager"), wantOpen: 1, wantLine: "finishing interrupted sagas failed; run `nexus recover`"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			openReapSaga(t, root)
			var logs testutil.Buffer
			runDaemonAt(t, root, daemon.Options{
				Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
				Manager: func(b control.Backend) (*lifecycle.Manager, error) {
					if c.fail != nil {
						return nil, c.fail
					}
					return lifecycle.New(lifecycle.Manager{Root: layout.Root(root), B: b})
				},
			})
			open, err := connect(t, root).OpenSagas(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(open) != c.wantOpen {
				t.Fatalf("%d sagas open once the daemon serves, want %d: %+v (log: %q)", len(open), c.wantOpen, open, logMessages(t, &logs))
			}
			if msgs := logMessages(t, &logs); len(msgs) < 2 || msgs[0] != "serving" || msgs[1] != c.wantLine {
				t.Fatalf("daemon log %q: want \"serving\", then %q", msgs, c.wantLine)
			}
		})
	}
}
