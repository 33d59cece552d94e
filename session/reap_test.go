package session_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/session"
	"github.com/nexus-sandbox/nexus/store"
)

// Without the binary: over a journal holding an event of a newer
// schema, the reap still scans, keeps the orphan it would otherwise
// delete, says why, and refuses --apply with nothing deleted.
func TestReapOverUnreadableJournalKeepsEverything(t *testing.T) {
	ctx := context.Background()
	root, err := store.PrepareRoot(testutil.ShortRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	n, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Append(ctx, events.New(ulid.Make(), time.Now().UTC(), "", events.WarningRaisedEvent{Reason: "test", Message: "first"})); err != nil {
		t.Fatal(err)
	}
	n.Close()
	orphan := filepath.Join(root, "disks", ulid.Make().String()+".raw")
	if err := os.MkdirAll(filepath.Dir(orphan), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(orphan, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}

	// A caller that cannot open the store in process (the CLI) is told
	// so, to hand the reap to one that can: the journal was never read,
	// so this is no verdict on it.
	if rep, err := session.Reap(ctx, root, control.ConnectOptions{}, nil, lifecycle.ReapOptions{}); !errors.Is(err, control.ErrInProcess) || rep != nil {
		t.Fatalf("reap without an in-process store: %v %+v, want ErrInProcess", err, rep)
	}

	// Readable: the orphan is one, so the fallback below is what keeps it.
	var rep *lifecycle.ReapReport
	testutil.ReapUntilConclusive(t, "reap over a readable journal", func() (bool, string) {
		rep, err = session.Reap(ctx, root, control.ConnectOptions{InProcess: local.InProcess{}}, nil, lifecycle.ReapOptions{})
		if err != nil || rep == nil {
			t.Fatalf("readable journal: %v %+v", err, rep)
		}
		for _, k := range rep.Kept {
			if testutil.KeptInconclusive(string(k.Verdict), k.Reason) {
				return true, fmt.Sprintf("%+v", rep.Kept)
			}
		}
		return false, ""
	})
	if rep.Journal != "" || len(rep.Orphans) != 1 || rep.Orphans[0].Path != orphan {
		t.Fatalf("readable journal: %+v", rep)
	}

	appendNewerSchema(t, filepath.Join(root, "journal"))
	rep, err = session.Reap(ctx, root, control.ConnectOptions{InProcess: local.InProcess{}}, nil, lifecycle.ReapOptions{})
	if err != nil || rep == nil || rep.Journal == "" || len(rep.Orphans) != 0 || len(rep.Kept) != 1 || rep.Kept[0].Verdict != "ambiguous" {
		t.Fatalf("dry run over an unreadable journal: %v %+v", err, rep)
	}
	rep, err = session.Reap(ctx, root, control.ConnectOptions{InProcess: local.InProcess{}}, nil, lifecycle.ReapOptions{Apply: true})
	if err == nil || !strings.Contains(err.Error(), "nothing deleted") || rep == nil || len(rep.Deleted) != 0 {
		t.Fatalf("apply over an unreadable journal: %v %+v", err, rep)
	}
	if _, err := os.Stat(orphan); err != nil {
		t.Fatalf("the orphan went: %v", err)
	}
}

// appendNewerSchema appends, behind nexus's back, an event of a schema
// version no nexus knows yet.
func appendNewerSchema(t *testing.T, dir string) {
	t.Helper()
	j, err := journal.Open(context.Background(), journal.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	id := ulid.Make()
	data, err := msgpack.Marshal(map[string]any{"f": 1, "id": id[:], "t": "sandbox.stopped", "v": 9, "ts": time.Now().UnixNano(), "p": map[string]any{"hover": true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Append(context.Background(), journal.Message{Subject: "nexus.events.sandbox.stopped._", ID: id.String(), Data: data}); err != nil {
		t.Fatal(err)
	}
}
