package lifecycle

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/logindex"
)

// LogKinds are the logs a sandbox has, by the name `nexus logs --log` takes.
var LogKinds = []string{"console", "vmm", "supervisor"}

// followPoll is how often a followed log is checked for new bytes.
const followPoll = 200 * time.Millisecond

// LogPath is the state-root path of one of a sandbox's logs.
func (m *Manager) LogPath(id, kind string) (string, error) {
	switch kind {
	case "console":
		return m.Root.ConsoleLog(id), nil
	case "vmm":
		return m.Root.VMMLog(id), nil
	case "supervisor":
		return m.Root.SupervisorLog(id), nil
	}
	return "", fmt.Errorf("log %q: want one of %v", kind, LogKinds)
}

// LogIndexed says which logs have a time index, so their lines can be
// placed in time (--since, --timestamps): the console, which the VMM
// writes without times and the supervisor indexes while it runs.
func LogIndexed(kind string) bool { return kind == "console" }

// ErrNoLogIndex refuses a time for a log that has no index.
var ErrNoLogIndex = errors.New("has no time index")

// Check refuses options a log cannot honour: a time (Since, Timestamps)
// for a log without a time index.
func (o LogOptions) Check() error {
	if (!o.Since.IsZero() || o.Timestamps) && !LogIndexed(o.Kind) {
		return fmt.Errorf("--log %s %w: --since and --timestamps work on the console log only", o.Kind, ErrNoLogIndex)
	}
	return nil
}

// LogOptions choose what Logs prints.
type LogOptions struct {
	// Kind is one of LogKinds.
	Kind string
	// Tail, when positive, starts at the log's last Tail lines instead of
	// its beginning (of those since Since, when it is set).
	Tail int
	// Follow keeps copying what is appended, the way tail -f does.
	Follow bool
	// Since, when set, starts at the first line whose time is at or
	// after it; Timestamps prefixes each line with its time. Both need a
	// log with a time index (LogIndexed): a line's time is when the
	// supervisor first saw it whole, accurate to about a second.
	Since      time.Time
	Timestamps bool
}

// Logs copies one of a sandbox's logs to w. With Follow it keeps copying
// what is appended until ctx ends or the log is removed (the sandbox was).
// A sandbox that never booted has no log yet: that is an empty log, not an
// error.
func (m *Manager) Logs(ctx context.Context, ref string, opt LogOptions, w io.Writer) error {
	sb, err := m.Find(ctx, ref)
	if err != nil {
		return err
	}
	path, err := m.LogPath(sb.ID, opt.Kind)
	if err != nil {
		return err
	}
	if err := opt.Check(); err != nil {
		return err
	}
	indexPath := ""
	if opt.Timestamps || !opt.Since.IsZero() {
		indexPath = m.Root.ConsoleIndex(sb.ID)
	}
	c := &logCopy{root: string(m.Root), path: path, indexPath: indexPath, opt: opt, w: w}
	defer c.close()
	for {
		if err := c.open(); err != nil {
			return err
		}
		if err := c.copy(); err != nil {
			return err
		}
		if !opt.Follow {
			return c.flush()
		}
		if c.f != nil {
			// Removed by rm (or the reaper): nothing more can be written to it.
			if _, err := fsx.Stat(string(m.Root), path); errors.Is(err, os.ErrNotExist) {
				return c.flush()
			}
		} else if _, err := m.Find(ctx, sb.ID); errors.Is(err, ErrNotFound) {
			// No log was opened, and none will be: its sandbox was removed
			// (rm can remove it between the lookup above and the first open).
			return c.flush()
		} else if err != nil && ctx.Err() == nil {
			return err
		}
		select {
		case <-ctx.Done():
			return c.flush()
		case <-time.After(followPoll):
		}
	}
}

// logCopy is one log being copied, with its time index when times are
// asked for.
type logCopy struct {
	root, path, indexPath string
	opt                   LogOptions
	w                     io.Writer

	f   *os.File
	idx *logindex.Reader
	// pos is the log's offset read up to; line holds the bytes of the
	// line being read, which begins at pos-len(line).
	pos  int64
	line []byte
	// mod is the log's modification time as it was last read.
	mod time.Time
}

func (c *logCopy) close() {
	if c.f != nil {
		c.f.Close()
	}
	if c.idx != nil {
		c.idx.Close()
	}
}

// open opens the log once it exists and moves to where the copy starts.
func (c *logCopy) open() error {
	if c.f != nil {
		return nil
	}
	f, err := fsx.Open(c.root, c.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	c.f = f
	if c.indexPath != "" {
		// A log without its index yet (a sandbox that has not booted
		// since nexus kept one) reads as an index with no records.
		xf, err := fsx.Open(c.root, c.indexPath)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		c.idx = logindex.NewReader(xf)
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	start := int64(0)
	if !c.opt.Since.IsZero() {
		off, fromEnd, err := c.idx.Since(c.opt.Since, fi.ModTime())
		if err != nil {
			return err
		}
		if fromEnd {
			off = fi.Size()
		}
		if start, err = lineStart(f, off); err != nil {
			return err
		}
	}
	if c.opt.Tail > 0 {
		tail, err := lastLinesStart(f, c.opt.Tail)
		if err != nil {
			return err
		}
		start = max(start, tail)
	}
	if c.idx != nil {
		if err := c.idx.From(start); err != nil {
			return err
		}
	}
	c.pos = start
	_, err = f.Seek(start, io.SeekStart)
	return err
}

// copy copies what the log holds past pos; with times, the whole lines of
// it, each stamped.
func (c *logCopy) copy() error {
	if c.f == nil {
		return nil
	}
	if !c.opt.Timestamps {
		_, err := io.Copy(c.w, c.f)
		return err
	}
	// The modification time read before the bytes bounds every line
	// among them.
	fi, err := c.f.Stat()
	if err != nil {
		return err
	}
	c.mod = fi.ModTime()
	bw := bufio.NewWriter(c.w)
	r := bufio.NewReader(io.LimitReader(c.f, max(fi.Size()-c.pos, 0)))
	for {
		b, err := r.ReadSlice('\n')
		c.pos += int64(len(b))
		c.line = append(c.line, b...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if len(c.line) > 0 && c.line[len(c.line)-1] == '\n' {
			if err := c.stamp(bw); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return bw.Flush()
		}
	}
}

// flush prints a last line that has no newline, as the log ends.
func (c *logCopy) flush() error {
	if len(c.line) == 0 {
		return nil
	}
	return c.stamp(c.w)
}

// stamp prints the line read, prefixed with its time.
func (c *logCopy) stamp(w io.Writer) error {
	t, err := c.idx.Stamp(c.pos, c.mod)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s %s", t.UTC().Format(time.RFC3339), c.line)
	c.line = c.line[:0]
	return err
}

// lineStart is the start of the line that holds the byte at off (off
// itself when a line begins there).
func lineStart(f *os.File, off int64) (int64, error) {
	buf := make([]byte, tailChunk)
	for pos := off; pos > 0; {
		size := min(int64(len(buf)), pos)
		pos -= size
		if _, err := f.ReadAt(buf[:size], pos); err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:size], '\n'); i >= 0 {
			return pos + int64(i) + 1, nil
		}
	}
	return 0, nil
}

// tailChunk is how much of a log's end is read at a time to find its last
// lines.
const tailChunk = 64 << 10

// lastLinesStart is where f's last n lines start, read backwards from
// the end a chunk at a time so a long log costs what its tail holds. A
// final line without a newline counts as a line.
func lastLinesStart(f *os.File, n int) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := fi.Size()
	pos, newlines := end, 0
	buf := make([]byte, tailChunk)
	for pos > 0 {
		size := min(int64(len(buf)), pos)
		pos -= size
		if _, err := f.ReadAt(buf[:size], pos); err != nil {
			return 0, err
		}
		for i := size - 1; i >= 0; i-- {
			if buf[i] != '\n' || pos+i == end-1 {
				continue
			}
			if newlines++; newlines == n {
				return pos + i + 1, nil
			}
		}
	}
	return 0, nil
}
