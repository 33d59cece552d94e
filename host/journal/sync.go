package journal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Group commit: the journal, not the file store, makes appends durable.
//
// With SyncAlways the file store fsyncs every message on its own, so N
// concurrent appends cost N fsyncs. Instead the server runs without it, and
// every append path here publishes, then fsyncs the stream's message blocks
// itself (syncStore) before it returns an Ack: the acknowledgement a caller
// sees still comes after its record is on disk, and appends published
// together share that one fsync.
//
// This holds because an R1 file stream without SyncAlways writes each
// message into its block file (write(2), not a user-space buffer) before the
// server acknowledges the publish: nats-server sets AsyncFlush only for
// replicated or async-persist streams, and the journal stream is neither.
// What the store derives from the blocks (index.db, the per-subject index)
// is rebuilt from them after a crash, as it is after a kill today.

// syncState is what syncStore has made durable so far. Its own lock, not
// j.wmu, serialises the fsyncs, so a group's records can be published
// while the group before it is being synced (PublishGroup, SyncThrough);
// where both are held, j.wmu is taken first.
type syncState struct {
	mu    sync.Mutex
	block uint64 // the newest block at the last sync
	dir   bool   // the blocks directory was synced since Open
	count int
	// stored is the highest sequence a group or batch append has had
	// acknowledged by the server (written, maybe not yet synced); durable
	// the highest such sequence a completed fsync covers (written under mu,
	// read without it, so a reader never waits for an fsync to see it).
	stored  atomic.Uint64
	durable atomic.Uint64
}

// syncStore fsyncs every message block that may hold a record written since
// the last sync, and the blocks directory when a block appeared since.
func (j *Journal) syncStore() error {
	j.synced.mu.Lock()
	defer j.synced.mu.Unlock()
	return j.syncStoreLocked()
}

func (j *Journal) syncStoreLocked() error {
	// Every record acknowledged by now is in its block file (write(2)
	// returned): the fsync below covers it.
	covers := j.synced.stored.Load()
	if j.synced.block > 0 && j.synced.dir {
		done, err := j.syncKnownBlocksLocked()
		if err != nil {
			return fmt.Errorf("journal sync: %w", err)
		}
		if done {
			j.synced.count++
			noteStored(&j.synced.durable, covers)
			return nil
		}
	}
	return j.syncAllBlocksLocked(covers)
}

// syncKnownBlocksLocked is the common case without listing the directory
// (a listing cost as much CPU as the fsync on a busy daemon): the store
// writes into the block the last sync saw, or into the ones after it,
// which the store numbers in order. It returns false, having synced
// nothing, when that block is gone (compacted) or a new one appeared: the
// full listing then decides. A failed fsync is returned, never retried: a
// second fsync after an I/O error can succeed with the data lost.
func (j *Journal) syncKnownBlocksLocked() (bool, error) {
	dir := j.msgsDir()
	next := filepath.Join(dir, strconv.FormatUint(j.synced.block+1, 10)+".blk")
	if _, err := os.Lstat(next); !errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	err := fsyncPath(filepath.Join(dir, strconv.FormatUint(j.synced.block, 10)+".blk"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// syncAllBlocksLocked lists the blocks and syncs every one that may have
// grown since the last sync, and the directory when one appeared.
func (j *Journal) syncAllBlocksLocked(covers uint64) error {
	dir := j.msgsDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("journal sync: %w", err)
	}
	var newest uint64
	var blocks []uint64
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".blk")
		if !ok {
			continue
		}
		idx, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			continue
		}
		newest = max(newest, idx)
		// A block sealed before the last sync was synced then, with its
		// last record; the one written at that moment may have grown since.
		if idx >= j.synced.block {
			blocks = append(blocks, idx)
		}
	}
	for _, idx := range blocks {
		if err := fsyncPath(filepath.Join(dir, strconv.FormatUint(idx, 10)+".blk")); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // compacted away; its records are in a later block
			}
			return fmt.Errorf("journal sync: %w", err)
		}
	}
	if newest > j.synced.block || !j.synced.dir {
		// A new block file is durable only once its directory entry is.
		if err := fsyncPath(dir); err != nil {
			return fmt.Errorf("journal sync: %w", err)
		}
		j.synced.dir = true
	}
	j.synced.block = newest
	j.synced.count++
	noteStored(&j.synced.durable, covers)
	return nil
}

func fsyncPath(path string) error {
	if testNoFsync {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	return errors.Join(err, f.Close())
}

// Syncs is how many times the journal has fsynced its store: one per
// Append, AppendBatch or AppendGroup that stored something.
func (j *Journal) Syncs() int {
	j.synced.mu.Lock()
	defer j.synced.mu.Unlock()
	return j.synced.count
}

// DurableThrough is the highest sequence stored by AppendGroup,
// PublishGroup or AppendBatch that a completed fsync covers: no such
// append may be acknowledged to its writer above it.
func (j *Journal) DurableThrough() uint64 {
	return j.synced.durable.Load()
}

// SyncThrough returns once the records up to seq, which PublishGroup
// stored, are on disk: at once if an fsync that started after they were
// written has completed (another group's, which covered them too),
// otherwise after one of its own. Publishing goes on meanwhile.
func (j *Journal) SyncThrough(seq uint64) error {
	return j.SyncTurn()(seq)
}

// SyncTurn waits until no fsync is under way and reserves the next one: it
// returns SyncThrough, to be called exactly once. A group committer takes
// its turn before letting the next group publish, so at most one group
// waits for the fsync under way, and the next forms meanwhile from every
// writer that arrives, instead of many small groups each publishing on
// its own.
func (j *Journal) SyncTurn() func(seq uint64) error {
	j.synced.mu.Lock()
	return func(seq uint64) error {
		if j.synced.durable.Load() >= seq {
			j.synced.mu.Unlock()
			return nil
		}
		err := j.syncStoreLocked()
		j.synced.mu.Unlock()
		if err != nil {
			j.wmu.Lock()
			defer j.wmu.Unlock()
			return j.failedAppend(fmt.Sprintf("through sequence %d", seq), err)
		}
		return nil
	}
}

// AppendGroup stores msgs in order with one fsync for all of them: it
// publishes them back to back without waiting for each acknowledgement,
// then syncs once. Message i expects the stream's last sequence to be
// last+i, so a message the journal refuses (a stale expectation, a stored
// id, a failed write) stops the group there: every message after it is
// refused too. It returns the acks of the stored prefix, durable, and the
// error that stopped it (nil if all were stored); append the rest one by
// one, with Append, to learn each one's fate.
func (j *Journal) AppendGroup(ctx context.Context, last uint64, msgs []Message) ([]Ack, error) {
	acks, err := j.PublishGroup(ctx, last, msgs)
	if len(acks) > 0 {
		if serr := j.SyncThrough(acks[len(acks)-1].Seq); serr != nil {
			return nil, serr
		}
	}
	return acks, err
}

// PublishGroup is AppendGroup without its fsync: the acks it returns are of
// records the server has written but that may not be on disk yet. Nothing
// may be acknowledged to a writer before SyncThrough(the last ack's Seq)
// returns nil. It lets the next group publish while this one syncs.
func (j *Journal) PublishGroup(ctx context.Context, last uint64, msgs []Message) ([]Ack, error) {
	for i, m := range msgs {
		if m.ID == "" {
			return nil, fmt.Errorf("journal group: message %d: message id is required", i)
		}
	}
	j.wmu.Lock()
	defer j.wmu.Unlock()
	reserve := true
	for _, m := range msgs {
		reserve = reserve && m.Reserve
	}
	if err := j.checkSpace(reserve); err != nil {
		return nil, fmt.Errorf("journal group of %d: %w", len(msgs), err)
	}
	if j.broken != "" {
		if err := j.reopenStore(ctx); err != nil {
			return nil, fmt.Errorf("journal group of %d: %w", len(msgs), err)
		}
	}
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	var stop error
	for i, m := range msgs {
		msg, popts := publishArgs(m)
		popts = append(popts, jetstream.WithExpectLastSequence(last+uint64(i)))
		f, err := j.js.PublishMsgAsync(msg, popts...)
		if err != nil {
			stop = fmt.Errorf("journal group: publish %s: %w", m.ID, err)
			break
		}
		futures = append(futures, f)
	}
	acks := make([]Ack, 0, len(futures))
	timeout := time.NewTimer(appendWait(ctx))
	defer timeout.Stop()
	for i, f := range futures {
		var err error
		select {
		case ack := <-f.Ok():
			if stop == nil && len(acks) == i {
				acks = append(acks, Ack{Seq: ack.Sequence, Duplicate: ack.Duplicate})
			}
			continue
		case err = <-f.Err():
		case <-timeout.C:
			err = fmt.Errorf("no acknowledgement within %s", appendWait(ctx))
		case <-ctx.Done():
			err = ctx.Err()
		}
		if stop == nil {
			stop = fmt.Errorf("journal group: %s: %w", msgs[i].ID, err)
		}
		if !errors.As(err, new(*jetstream.APIError)) {
			// Without an answer the rest cannot be told apart; Append
			// each of them again, which de-duplicates by id.
			break
		}
	}
	if len(acks) > 0 {
		noteStored(&j.synced.stored, acks[len(acks)-1].Seq)
	}
	if stop != nil && len(acks) < len(msgs) {
		if cause := j.storeFailure(); cause != "" {
			j.broken = cause
		}
	}
	return acks, stop
}

// noteStored raises v to seq if it is lower.
func noteStored(v *atomic.Uint64, seq uint64) {
	for cur := v.Load(); seq > cur && !v.CompareAndSwap(cur, seq); cur = v.Load() {
	}
}

// appendWait bounds how long a group waits for its acknowledgements.
func appendWait(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return time.Minute
}

// publishArgs is m as a publish: its headers and the options every append
// path shares. The caller adds the stream expectation.
func publishArgs(m Message) (*nats.Msg, []jetstream.PublishOpt) {
	popts := []jetstream.PublishOpt{jetstream.WithMsgID(m.ID), jetstream.WithExpectStream(StreamName)}
	hdr := nats.Header{}
	if m.ExpectSubjects != "" {
		// The per-subject check runs in the server, before de-duplication,
		// on the same stored index the reads use.
		hdr.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(m.ExpectSubjectSeq, 10))
		hdr.Set(expectedLastSubjSeqSubjHeader, m.ExpectSubjects)
	}
	return &nats.Msg{Subject: AppendSubject(m.Subject), Data: m.Data, Header: hdr}, popts
}

// syncStreamFiles makes the stream itself durable once it is created or
// updated. Without SyncAlways the server writes the stream's meta.inf and
// meta.sum with no fsync, and creates the directories down to msgs/ with
// none: a power cut could leave the files empty or the directories
// missing, and the server would then skip or never find the stream.
// Children are synced before the directories that hold them.
func (j *Journal) syncStreamFiles() error {
	stream := filepath.Dir(j.msgsDir())
	paths := []string{filepath.Join(stream, "meta.inf"), filepath.Join(stream, "meta.sum")}
	for dir := j.msgsDir(); ; dir = filepath.Dir(dir) {
		paths = append(paths, dir)
		if dir == j.dir {
			break
		}
	}
	for _, p := range append(paths, filepath.Dir(j.dir)) {
		if err := fsyncPath(p); err != nil {
			return fmt.Errorf("journal: sync the stream's files: %w", err)
		}
	}
	return nil
}

// mkdirDurable creates dir and any missing parents, fsyncing the parent
// of each one it creates.
func mkdirDurable(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirDurable(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil
		}
		return err
	}
	return fsyncPath(filepath.Dir(dir))
}
