// Package reaper decides, without any I/O, which host resources under a
// state root are orphans: it joins what a filesystem scan found with the
// journal's ownership, the intent leases probed before the journal was
// read (so a create that committed meanwhile is seen), and the liveness
// gate, and resolves every doubt to KEEP. host/ gathers the observations; lifecycle applies verdicts.
package reaper

import (
	"time"

	"github.com/nexus-sandbox/nexus/layout"
)

// Entry is one resource found on disk: what its name says it is and what
// a stat of it saw.
type Entry struct {
	layout.Name
	// Rel is the path relative to the state root (for a process, /proc/<pid>).
	Rel string
	// Symlink marks a link where a resource should be: never followed,
	// never deleted, reported for an operator.
	Symlink bool
	Dir     bool
	ModTime time.Time
	// Allocated is st_blocks*512 (for a directory: of its whole tree).
	Allocated int64
	// StatErr is a stat failure other than "not there": a doubt, so kept.
	StatErr string
	// Pid and StartTicks identify a supervisor-process entry.
	Pid        int
	StartTicks uint64
}

// Identify is the entry a scan found as name directly in dir (one of
// layout.Dirs), named by layout's grammar; a name of no shape of its
// directory is Unparsed, and the reaper keeps it unless the journal names it.
func Identify(dir, name string, isDir bool) Entry {
	return Entry{Name: layout.ParseEntry(dir, name, isDir), Rel: dir + "/" + name, Dir: isDir}
}
