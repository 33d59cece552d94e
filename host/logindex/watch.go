package logindex

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Period is how often Watch looks at the log: a line's time is accurate
// to about this much.
const Period = time.Second

// Watcher keeps the index of one log.
type Watcher struct {
	// Log is the log's path, Index the index's. The index must exist:
	// whoever made the log made it, and cleared it when the log began
	// anew (a boot).
	Log, Index string
	// Every is the period (Period when zero).
	Every time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Logf reports a failure to read the log or write the index, once
	// until it heals.
	Logf func(format string, a ...any)

	f      *os.File
	last   int64
	failed bool
}

// Look records the log's size if it changed since the last look. The
// first look is best taken before anything writes the log anew (a VMM
// about to boot): what it sees is the log as it stood.
func (w *Watcher) Look() {
	if w.Now == nil {
		w.Now = time.Now
	}
	w.report(w.look())
}

// Run looks every period until ctx ends, then once more so what was
// written before the end is held, and closes the index.
func (w *Watcher) Run(ctx context.Context) {
	if w.Every <= 0 {
		w.Every = Period
	}
	defer func() {
		if w.f != nil {
			w.f.Close()
		}
	}()
	t := time.NewTicker(w.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			w.Look()
			return
		case <-t.C:
			w.Look()
		}
	}
}

func (w *Watcher) report(err error) {
	switch {
	case err == nil:
		w.failed = false
	case !w.failed:
		w.failed = true
		if w.Logf != nil {
			w.Logf("log index %s: %v", w.Index, err)
		}
	}
}

// look records the log's size if it changed. The first look at an index
// takes its newest record as what was seen last; an empty index takes the
// log's size then, unrecorded: the log is about to begin anew (the
// index's maker cleared it for a boot) or its bytes were written while
// nothing watched, and a later record bounds them either way.
func (w *Watcher) look() error {
	fi, err := os.Lstat(w.Log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return errors.New(w.Log + " is not a regular file")
	}
	size := fi.Size()
	if w.f == nil {
		f, err := os.OpenFile(w.Index, os.O_RDWR|os.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if w.last, err = lastOffset(f, size); err != nil {
			f.Close()
			return err
		}
		w.f = f
	}
	if size == w.last {
		return nil
	}
	if size < w.last {
		// The log began anew: the records say nothing of it.
		if err := w.f.Truncate(0); err != nil {
			return err
		}
	}
	if _, err := w.f.Write(Record{Time: w.Now(), Offset: size}.encode()); err != nil {
		return err
	}
	w.last = size
	return nil
}

// lastOffset is the offset of f's newest record, or size when it has
// none. A torn record after it is cut off, so the next is whole.
func lastOffset(f *os.File, size int64) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	whole := fi.Size() - fi.Size()%RecordSize
	if whole != fi.Size() {
		if err := f.Truncate(whole); err != nil {
			return 0, err
		}
	}
	if whole == 0 {
		return size, nil
	}
	b := make([]byte, RecordSize)
	if _, err := f.ReadAt(b, whole-RecordSize); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	rec, err := decode(b)
	if err != nil {
		// Start over rather than append to what cannot be read.
		return size, f.Truncate(0)
	}
	return rec.Offset, nil
}
