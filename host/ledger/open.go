package ledger

import (
	"os"
	"path/filepath"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// The ledger's files live in <state-root>/runs/ and are nexus's own, so
// they are opened through fsx beneath that directory: a link planted under
// a run file's name is refused, not followed, and a FIFO is an error, not a
// hang. probeRecord, the per-run hot path of a sweep, keeps its own
// O_NOFOLLOW|O_NONBLOCK open relative to the directory's descriptor for
// no link followed at the name and no FIFO hang, at a third of the
// syscalls.

func openIn(path string, flag int, perm os.FileMode) (*os.File, error) {
	return fsx.OpenFile(filepath.Dir(path), filepath.Base(path), flag, perm)
}

func readIn(path string) ([]byte, error) {
	return fsx.ReadFile(filepath.Dir(path), filepath.Base(path))
}

func writeIn(path string, data []byte, perm os.FileMode) error {
	return fsx.WriteFile(filepath.Dir(path), filepath.Base(path), data, perm)
}
