package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nexus-sandbox/nexus/host/fsx"
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

// LogOptions choose what Logs prints.
type LogOptions struct {
	// Kind is one of LogKinds.
	Kind string
	// Tail, when positive, starts at the log's last Tail lines instead of
	// its beginning.
	Tail int
	// Follow keeps copying what is appended, the way tail -f does.
	Follow bool
}

// Logs copies one of a sandbox's logs to w. With Follow it keeps copying
// what is appended until ctx ends or the log is removed (the sandbox was).
// A sandbox that never booted has no log yet: that is an empty log, not an
// error.
func (m *Manager) Logs(ctx context.Context, ref string, opt LogOptions, w io.Writer) error {
	kind, follow := opt.Kind, opt.Follow
	sb, err := m.Find(ctx, ref)
	if err != nil {
		return err
	}
	path, err := m.LogPath(sb.ID, kind)
	if err != nil {
		return err
	}
	var f *os.File
	open := func() error {
		if f != nil {
			return nil
		}
		var err error
		f, err = fsx.Open(string(m.Root), path)
		if errors.Is(err, os.ErrNotExist) {
			f = nil
			return nil
		}
		if err != nil || opt.Tail <= 0 {
			return err
		}
		return seekLastLines(f, opt.Tail)
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for {
		if err := open(); err != nil {
			return err
		}
		if f != nil {
			if _, err := io.Copy(w, f); err != nil {
				return err
			}
		}
		if !follow {
			return nil
		}
		if f != nil {
			// Removed by rm (or the reaper): nothing more can be written to it.
			if _, err := fsx.Stat(string(m.Root), path); errors.Is(err, os.ErrNotExist) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(followPoll):
		}
	}
}

// tailChunk is how much of a log's end is read at a time to find its last
// lines.
const tailChunk = 64 << 10

// seekLastLines leaves f positioned at the start of its last n lines, read
// backwards from the end a chunk at a time so a long log costs what its
// tail holds. A final line without a newline counts as a line.
func seekLastLines(f *os.File, n int) error {
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	pos, newlines := end, 0
	buf := make([]byte, tailChunk)
	for pos > 0 {
		size := min(int64(len(buf)), pos)
		pos -= size
		if _, err := f.ReadAt(buf[:size], pos); err != nil {
			return err
		}
		for i := size - 1; i >= 0; i-- {
			if buf[i] != '\n' || pos+i == end-1 {
				continue
			}
			if newlines++; newlines == n {
				_, err := f.Seek(pos+i+1, io.SeekStart)
				return err
			}
		}
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}
