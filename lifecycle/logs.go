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

// Logs copies one of a sandbox's logs to w. With follow it keeps copying
// what is appended until ctx ends or the log is removed (the sandbox was),
// the way tail -f does. A sandbox that never booted has no log yet: that
// is an empty log, not an error.
func (m *Manager) Logs(ctx context.Context, ref, kind string, follow bool, w io.Writer) error {
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
		return err
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
