// Package audit is replay's edge: it reads the journal an audit is about
// (a private copy of a journal directory, or a host's mirror stream on a
// fleet) and scans the state root a diff compares it with, so replay
// itself stays a pure reading of records.
package audit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/host/scan"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/replay"
)

// AuditorAPIPrefix is the JetStream API prefix an auditor of the fleet's
// permission template reads mirrors through.
const AuditorAPIPrefix = fleet.AuditAPIPrefix

// Rejected is a record of a mirror that is not its host's.
type Rejected = fleet.Rejected

// Source is the journal an audit reads: the mirror Stream on the NATS
// server at NATS when NATS is set, else the journal directory Dir (the
// journal of the state root Root when Dir is empty), read from a copy.
type Source struct {
	Root, Dir string

	NATS, Stream, Creds, APIPrefix string
	// Rejected gets each record of a mirror that is not its host's, which
	// the audit skips (nil: dropped silently).
	Rejected func(Rejected)
}

// Each calls fn with every record of the source, in order. A journal
// directory is copied into a scratch directory first, so a daemon may keep
// serving it and the audit never writes the store it reads; the copy is
// removed before Each returns.
func Each(ctx context.Context, src Source, fn func(replay.Record)) error {
	pass := func(r journal.Record) error {
		fn(replay.Record{Seq: r.Seq, MsgID: r.MsgID, Data: r.Data})
		return nil
	}
	if src.NATS != "" {
		return fleet.ReadMirror(ctx, src.NATS, src.Creds, src.APIPrefix, src.Stream, pass, src.Rejected)
	}
	dir := src.Dir
	if dir == "" {
		dir = layout.Root(src.Root).Journal()
	}
	scratch, err := os.MkdirTemp("", "nexus-replay-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	j, err := journal.OpenCopy(ctx, dir, scratch)
	if err != nil {
		return err
	}
	defer j.Close()
	return j.Read(ctx, 1, "", pass)
}

// Records is every record of the source, in order.
func Records(ctx context.Context, src Source) ([]replay.Record, error) {
	var recs []replay.Record
	err := Each(ctx, src, func(r replay.Record) { recs = append(recs, r) })
	return recs, err
}

// Diff compares recs with what a scan of the state root root finds. A
// scan that could not read a directory is an error: the diff would report
// its files missing.
func Diff(root string, recs []replay.Record) (replay.Divergence, error) {
	res, err := scan.Root(root)
	if err != nil {
		return replay.Divergence{}, err
	}
	if len(res.Errors) > 0 {
		return replay.Divergence{}, fmt.Errorf("scan incomplete, a diff would be wrong: %s", strings.Join(res.Errors, "; "))
	}
	onDisk := make([]string, 0, len(res.Entries))
	for _, e := range res.Entries {
		onDisk = append(onDisk, e.Rel)
	}
	present := func(rel string) bool {
		_, err := os.Lstat(filepath.Join(root, rel))
		return err == nil
	}
	return replay.Diff(recs, onDisk, present)
}
