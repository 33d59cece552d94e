package journal

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/disk"
)

// ErrNoSpace means an append was refused, or failed, because the
// filesystem holding the journal is full or nearly so. Reads still work;
// appends work again as soon as space is freed, without a restart.
var ErrNoSpace = errors.New("no space left")

// Space is the free-space policy of appends. nats-server disables a
// stream's writes for good after one failed block write (the filestore's
// and the stream's write error are sticky, and a publish that hits it gets
// no answer at all), so the journal refuses early, while the filesystem
// still has room, instead of letting the store run into ENOSPC.
type Space struct {
	// Reserve: an append that does not free space (Message.Reserve unset)
	// is refused while less than this many bytes are free.
	Reserve int64
	// Floor: every append is refused while less than this many bytes are
	// free. Between Floor and Reserve only the events of operations that
	// free space (rm, reap, recover, compensations) are admitted.
	Floor int64
}

// DefaultSpace is the policy Open applies when Options.Space is nil, for
// a filesystem of size bytes: a sixteenth of it, at most 64 MiB, kept free
// of everything but freeing operations, and an eighth of that kept free of
// every append (room for a removal's dozen events and the projections'
// snapshots).
func DefaultSpace(size int64) Space {
	reserve := min(size/16, 64<<20)
	return Space{Reserve: reserve, Floor: reserve / 8}
}

// SpaceError names the full filesystem. It wraps ErrNoSpace.
type SpaceError struct {
	Mount string // mount point of the filesystem holding Path
	Path  string // the journal directory
	Free  int64  // bytes free to unprivileged writers when it was checked
	Need  int64  // bytes the refused append needed free (0: the store hit ENOSPC)
	Floor int64  // what appends of operations that free space need
	Cause string // the store's write error, when the filesystem already ran out
}

func (e *SpaceError) Error() string {
	where := fmt.Sprintf("no space left on the filesystem mounted at %s (holding %s)", e.Mount, e.Path)
	switch {
	case e.Cause != "":
		return fmt.Sprintf("%s: the store failed to write (%s); free space there, the next append reopens the store", where, e.Cause)
	case e.Need > e.Floor:
		return fmt.Sprintf("%s: %s free, appends need %s; free space there (rm, reap and recover still work down to %s)",
			where, disk.Human(e.Free), disk.Human(e.Need), disk.Human(e.Floor))
	}
	return fmt.Sprintf("%s: %s free, even rm, reap and recover need %s; free space there", where, disk.Human(e.Free), disk.Human(e.Need))
}

func (e *SpaceError) Unwrap() error { return ErrNoSpace }

// checkSpace refuses an append that would eat into the space the policy
// keeps free; reserve admits it down to the floor.
func (j *Journal) checkSpace(reserve bool) error {
	need := j.space.Reserve
	if reserve {
		need = j.space.Floor
	}
	if need <= 0 {
		return nil
	}
	free, err := disk.FreeBytes(j.dir)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if free >= need {
		return nil
	}
	return &SpaceError{Mount: mountPoint(j.dir), Path: j.dir, Free: free, Need: need, Floor: j.space.Floor}
}

const jetStreamDisabled = "JetStream is disabled"

// storeFailure reports why JetStream no longer takes writes, or "" if it
// does: JetStream shut down, or the stream holding a write error.
func (j *Journal) storeFailure() string {
	if !j.srv.JetStreamEnabled() {
		return jetStreamDisabled
	}
	h := j.srv.Healthz(&server.HealthzOptions{Account: account, Stream: StreamName})
	if h == nil || h.Error == "" {
		return ""
	}
	return h.Error
}

// storeProbeInterval is how often a publish still waiting for its answer
// asks whether the store has failed.
const storeProbeInterval = 100 * time.Millisecond

// awaitAnswer runs publish, which waits for the server's answer, under a
// context that ends when ctx does, after slowHostTimeout when ctx sets no
// deadline, or as soon as the store reports a failed write: a failed store
// never answers until it is reopened, while a slow one only needs time.
// Only a write error (or JetStream shut down) ends the wait: the health
// check's other complaints come and go on a busy server.
func (j *Journal) awaitAnswer(ctx context.Context, publish func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, ok := ctx.Deadline(); !ok {
		ctx, cancel = context.WithTimeout(ctx, slowHostTimeout)
		defer cancel()
	}
	probe := time.NewTicker(storeProbeInterval)
	defer probe.Stop()
	done := make(chan error, 1)
	go func() { done <- publish(ctx) }()
	for {
		select {
		case err := <-done:
			return err
		case <-probe.C:
			if cause := j.storeFailure(); strings.Contains(cause, "write error") || cause == jetStreamDisabled {
				cancel()
				return <-done
			}
		}
	}
}

// failedAppend turns a publish that failed on a broken store into an
// error naming the cause, and marks the store for reopening.
func (j *Journal) failedAppend(id string, err error) error {
	cause := j.storeFailure()
	if cause == "" {
		return fmt.Errorf("journal append %s: %w", id, err)
	}
	j.broken = cause
	if strings.Contains(cause, "no space left") {
		free, _ := disk.FreeBytes(j.dir)
		return fmt.Errorf("journal append %s: %w", id, &SpaceError{Mount: mountPoint(j.dir), Path: j.dir, Free: free, Cause: lastClause(cause)})
	}
	return fmt.Errorf("journal append %s: the store stopped taking writes (%s); the next append reopens it", id, cause)
}

// reopenStore restarts JetStream inside the running server, which drops
// the stream's sticky write error: a fresh filestore loads the blocks from
// disk (the server truncated the record it failed to write). The blocks
// are verified first, as Open does; a damaged one keeps the store shut.
func (j *Journal) reopenStore(ctx context.Context) error {
	if err := j.srv.ShutdownJetStream(); err != nil {
		return fmt.Errorf("journal: stop the failed store: %w", err)
	}
	if err := VerifyStreamBlocks(j.msgsDir(), StreamName); err != nil {
		j.broken = err.Error()
		return fmt.Errorf("journal: reopen after a failed write: %w", err)
	}
	cfg := j.jsConfig
	if err := j.srv.EnableJetStream(&cfg); err != nil {
		return fmt.Errorf("journal: reopen after a failed write: %w", err)
	}
	stream, err := j.js.CreateOrUpdateStream(ctx, streamConfig(j.dedupe))
	if err != nil {
		return fmt.Errorf("journal: reopen stream %s: %w", StreamName, err)
	}
	j.smu.Lock()
	j.stream = stream
	j.smu.Unlock()
	j.broken = ""
	j.reopened++
	return nil
}

func (j *Journal) msgsDir() string {
	return filepath.Join(j.dir, "jetstream", account, "streams", StreamName, "msgs")
}

func lastClause(s string) string {
	if i := strings.LastIndex(s, ": "); i >= 0 && strings.Contains(s[i:], "no space left") {
		// "...write error: write <path>: no space left on device" keeps the path.
		if k := strings.LastIndex(s[:i], "write error: "); k >= 0 {
			return s[k+len("write error: "):]
		}
	}
	return s
}

// mountPoint is the top directory of the filesystem holding dir: walk up
// while the parent is on the same device.
func mountPoint(dir string) string {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return dir
	}
	cur := dir
	for cur != "/" {
		parent := filepath.Dir(cur)
		var pst unix.Stat_t
		if err := unix.Stat(parent, &pst); err != nil || pst.Dev != st.Dev {
			break
		}
		cur = parent
	}
	return cur
}

// Usage is what the stream holds and the room its filesystem has left.
type Usage struct {
	Bytes   uint64 // the stream's stored bytes
	Records uint64
	Free    int64 // bytes free to unprivileged writers
	Space   Space // the policy appends are held to
}

// Usage measures the stream and the free space of the filesystem holding
// it.
func (j *Journal) Usage(ctx context.Context) (Usage, error) {
	info, err := j.currentStream().Info(ctx)
	if err != nil {
		return Usage{}, fmt.Errorf("journal: %w", err)
	}
	free, err := disk.FreeBytes(j.dir)
	if err != nil {
		return Usage{}, fmt.Errorf("journal: %w", err)
	}
	return Usage{Bytes: info.State.Bytes, Records: info.State.Msgs, Free: free, Space: j.space}, nil
}
