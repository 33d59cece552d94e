//go:build nexusd

package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/nexus-sandbox/nexus/audit"
	"github.com/nexus-sandbox/nexus/replay"
)

// source is the journal the flags name; --nats needs --stream and
// excludes --journal.
func (f *replayFlags) source(g *globals) (audit.Source, error) {
	if f.natsURL != "" && (f.stream == "" || f.journalDir != "") {
		return audit.Source{}, usageError{errors.New("--nats needs --stream, and excludes --journal")}
	}
	return audit.Source{Root: g.stateDir, Dir: f.journalDir, NATS: f.natsURL, Stream: f.stream, Creds: f.natsCreds, APIPrefix: f.natsPrefix,
		Rejected: func(r audit.Rejected) { fmt.Fprintf(os.Stderr, "nexus: warning: skipped %s\n", r) }}, nil
}

// eachRecord calls fn with every record of the audited journal, in order.
func eachRecord(ctx context.Context, g *globals, f *replayFlags, fn func(replay.Record)) error {
	src, err := f.source(g)
	if err != nil {
		return err
	}
	return audit.Each(ctx, src, fn)
}

// readJournal returns every record of the audited journal.
func readJournal(ctx context.Context, g *globals, f *replayFlags) ([]replay.Record, error) {
	src, err := f.source(g)
	if err != nil {
		return nil, err
	}
	return audit.Records(ctx, src)
}

// diffRoot is where the state root and its journal's records disagree.
func diffRoot(root string, recs []replay.Record) (replay.Divergence, error) {
	return audit.Diff(root, recs)
}
