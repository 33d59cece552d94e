// Package reaper decides, without any I/O, which host resources under a
// state root are orphans: it joins what a filesystem scan found with the
// journal's ownership, the intent leases probed before the journal was
// read, and the liveness gate, and resolves every doubt to KEEP.
// host/ gathers the observations; lifecycle applies verdicts.
package reaper

import (
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/ledger"
)

// Dirs are the only directories a reap scans, relative to the state root.
// volumes/ is user-owned and structurally absent; images/ belongs to
// the image-cache prune; caches/ holds the shared builder cache, never reaped.
// logs/ holds the sandboxes' logs, which are theirs, beside the daemon's own
// log, which is no sandbox's (NotResource).
var Dirs = []string{"disks", "run", "supervisors", "builder-supervisors", "snapshots", "sandboxes", "logs"}

// logSuffixes are the per-sandbox logs in logs/ (layout.VMMLog,
// SupervisorLog, ConsoleLog).
var logSuffixes = []string{".vmm.log", ".supervisor.log", ".console.log"}

// NotResource says a name in a scanned directory is nexus's own and no
// sandbox's resource, so a scan does not report it at all: the daemon's
// log (logs/daemon.log, control.DaemonLog). A client run's watchdog log is
// a resource of its run (KindWatchdogLog), judged by the run's record.
func NotResource(dir, name string) bool {
	return dir == "logs" && name == "daemon.log"
}

// Entry is one resource found on disk, named back into what it is.
type Entry struct {
	Kind events.ResourceKind
	// Rel is the path relative to the state root (for a process, /proc/<pid>).
	Rel string
	// ID is the sandbox ULID the name carries ("" if none).
	ID string
	// Run is the client run a watchdog log belongs to (KindWatchdogLog).
	Run string
	// Handle is the safe handle a shadow disk or shadow intent is keyed by
	// (layout.SafeHandle; layout.HandleOf gives the handle back).
	Handle string
	// Legacy marks the old <x>.shadow.ext4 name, which embeds no handle.
	Legacy bool
	// Unparsed marks a name no pattern of its directory matches.
	Unparsed bool
	// Symlink marks a link where a resource should be: never followed,
	// never deleted, reported for an operator.
	Symlink bool
	Dir     bool
	ModTime time.Time
	// Allocated is st_blocks*512 (for a directory: of its whole tree).
	Allocated int64
	// StatErr is a stat failure other than "not there"; it is ambiguity,
	// so the entry is kept.
	StatErr string
	// Pid and StartTicks identify a supervisor-process entry.
	Pid        int
	StartTicks uint64
}

const (
	createIntentSuffix = ".create-intent.json"
	shadowIntentSuffix = ".shadow-intent.json"
	stageInfix         = ".stage-"
)

// CreateIntentRel is the create intent covering sandbox id.
func CreateIntentRel(id string) string { return "disks/" + id + createIntentSuffix }

// ShadowIntentRel is the shadow intent covering the shadow disks of a safe handle.
func ShadowIntentRel(safeHandle string) string { return "disks/" + safeHandle + shadowIntentSuffix }

// Identify names the entry `name` found directly in scanned directory dir
// (one of Dirs): its kind and, where the name carries them, the owning
// sandbox's ID, handle or client run. A name of no resource shape in that
// directory comes back Unparsed, with the directory's default kind, and is
// kept unless the journal names it.
func Identify(dir, name string, isDir bool) Entry {
	e := Entry{Rel: dir + "/" + name, Dir: isDir}
	switch dir {
	case "disks":
		identifyDisk(&e, name)
	case "run":
		rest, ok := strings.CutPrefix(name, "sb-")
		for _, s := range []struct {
			ext  string
			kind events.ResourceKind
		}{{".sock", events.KindAPISocket}, {".sock.lock", events.KindAPISocketLock}, {".vsock", events.KindVsockSocket}, {".iid", events.KindIIDSocket}} {
			if id, cut := strings.CutSuffix(rest, s.ext); ok && cut && layout.IsULID(id) {
				e.Kind, e.ID = s.kind, id
				return e
			}
		}
		e.Kind, e.Unparsed = events.KindAPISocket, true
	case "logs":
		if run, ok := layout.WatchdogLogRun(name); ok {
			e.Kind, e.Run, e.Unparsed = events.KindWatchdogLog, run, !ledger.ValidRunID(run) || isDir
			return e
		}
		e.Kind, e.Unparsed = events.KindLog, true
		for _, suffix := range logSuffixes {
			if id, cut := strings.CutSuffix(name, suffix); cut && layout.IsULID(id) && !isDir {
				e.ID, e.Unparsed = id, false
			}
		}
	default:
		e.Kind = map[string]events.ResourceKind{
			"supervisors":         events.KindSupervisorState,
			"builder-supervisors": events.KindBuilderSupervisor,
			"snapshots":           events.KindSnapshot,
			"sandboxes":           events.KindRecord,
		}[dir]
		if layout.IsULID(name) {
			e.ID = name
		} else {
			e.Unparsed = true
		}
	}
	return e
}

func identifyDisk(e *Entry, name string) {
	// A staged intent (".<final name>.stage-XXXX") is flocked before it is
	// renamed into place, so it is judged by its lease like the final one.
	probe := name
	if strings.HasPrefix(name, ".") {
		if i := strings.LastIndex(name, stageInfix); i > 0 {
			probe = name[1:i]
		}
	}
	switch {
	case strings.HasSuffix(probe, createIntentSuffix) && layout.IsULID(strings.TrimSuffix(probe, createIntentSuffix)):
		e.Kind, e.ID = events.KindCreateIntent, strings.TrimSuffix(probe, createIntentSuffix)
	case strings.HasSuffix(probe, shadowIntentSuffix) && len(probe) > len(shadowIntentSuffix):
		e.Kind, e.Handle = events.KindShadowIntent, strings.TrimSuffix(probe, shadowIntentSuffix)
		if _, ok := layout.HandleOf(e.Handle); !ok {
			e.Handle, e.Unparsed = "", true // no handle maps to this name
		}
	case strings.HasSuffix(name, ".raw") && layout.IsULID(strings.TrimSuffix(name, ".raw")):
		e.Kind, e.ID = events.KindRawDisk, strings.TrimSuffix(name, ".raw")
	case strings.HasSuffix(name, "-workspace.ext4") && layout.IsULID(strings.TrimSuffix(name, "-workspace.ext4")):
		e.Kind, e.ID = events.KindWorkspaceDisk, strings.TrimSuffix(name, "-workspace.ext4")
	case strings.HasSuffix(name, ".overlay-staging.ext4") && layout.IsULID(strings.TrimSuffix(name, ".overlay-staging.ext4")):
		// An overlay recovery's private copy (layout.OverlayStaging).
		e.Kind, e.ID = events.KindOverlayStaging, strings.TrimSuffix(name, ".overlay-staging.ext4")
	case strings.HasSuffix(name, ".shadow.ext4") && len(name) > len(".shadow.ext4"):
		e.Kind, e.Legacy = events.KindShadowDisk, true
	case strings.Contains(name, ".shadow.") && strings.HasSuffix(name, ".ext4"):
		e.Kind = events.KindShadowDisk
		// A shadow name has no '.', but a handle may contain ".shadow.":
		// the split is at the last one.
		e.Handle = name[:strings.LastIndex(name, ".shadow.")]
		safe := e.Handle
		// <childULID>-<parentSafeHandle>.shadow.<name>.ext4 is a fork or
		// restore child's copy of its parent's shadow disk: it belongs to
		// the child, whose handle it does not carry. A ULID never contains '-', so the split is unique
		// (and lifecycle refuses a handle that starts <ULID>-).
		if len(e.Handle) > 27 && e.Handle[26] == '-' && layout.IsULID(e.Handle[:26]) {
			e.ID, safe = e.Handle[:26], e.Handle[27:]
		}
		if _, ok := layout.HandleOf(safe); !ok {
			e.Handle, e.ID, e.Unparsed = "", "", true // no handle maps to this name
		}
	default:
		e.Kind, e.Unparsed = events.KindRawDisk, true
	}
}
