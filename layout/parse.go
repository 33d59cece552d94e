package layout

import (
	"path/filepath"
	"strings"

	"github.com/nexus-sandbox/nexus/events"
)

// Dirs are the directories of the state root whose entries are a
// sandbox's (or a client run's) resources, relative to the root: the names
// ParseEntry reads. volumes/ is the user's, images/ the image cache's,
// caches/ the shared builder cache's, journal/ the journal's: none of them
// is listed, so nothing in them is ever named a resource.
var Dirs = []string{"disks", "run", "supervisors", "builder-supervisors", "snapshots", "sandboxes", "logs"}

// Kinds are every kind a name in Dirs reads as (ParseEntry).
var Kinds = []events.ResourceKind{
	events.KindRawDisk, events.KindWorkspaceDisk, events.KindOverlayStaging, events.KindCreateIntent,
	events.KindShadowIntent, events.KindShadowDisk, events.KindAPISocket, events.KindAPISocketLock,
	events.KindVsockSocket, events.KindIIDSocket, events.KindSupervisorState, events.KindBuilderSupervisor,
	events.KindSnapshot, events.KindRecord, events.KindLog, events.KindWatchdogLog,
}

// NotResource says a name in one of Dirs is nexus's own and no sandbox's
// resource: the daemon's log (logs/daemon.log). A client run's watchdog log
// is a resource of its run (events.KindWatchdogLog).
func NotResource(dir, name string) bool {
	return dir == "logs" && name == "daemon.log"
}

// Name is what an entry of one of Dirs says it is: the kind of resource
// and whose it is. The builders of this package make every name; Parse
// and ParseEntry read one back.
type Name struct {
	// Kind is the resource kind; for a name that does not parse, the kind
	// its directory mostly holds.
	Kind events.ResourceKind
	// ID is the sandbox ULID the name carries ("" if none).
	ID string
	// Run is the client run a watchdog log belongs to.
	Run string
	// Handle is the safe handle (SafeHandle; HandleOf reverses it) that
	// keys a create's shadow disk or shadow intent.
	Handle string
	// Parent is the parent's safe handle (or ULID) in a fork or restore
	// child's copy of a shadow disk; the copy is the child's (ID).
	Parent string
	// Shadow is a shadow disk's shadow name.
	Shadow string
	// Staged marks an intent still under the temporary name it is
	// published from (".<final name>.stage-XXXX"); Kind and ID or Handle
	// are the final name's.
	Staged bool
	// Legacy marks the old <x>.shadow.ext4 name, which embeds no handle.
	Legacy bool
	// Unparsed marks a name no pattern of its directory matches.
	Unparsed bool
}

const (
	createIntentSuffix   = ".create-intent.json"
	shadowIntentSuffix   = ".shadow-intent.json"
	rawSuffix            = ".raw"
	workspaceSuffix      = "-workspace.ext4"
	overlayStagingSuffix = ".overlay-staging.ext4"
	shadowInfix          = ".shadow."
	ext4Suffix           = ".ext4"
	legacyShadowSuffix   = ".shadow.ext4"
	stageInfix           = ".stage-"
	socketPrefix         = "sb-"
)

// sockets are the run/ names of a sandbox: sb-<ULID><suffix>.
var sockets = []struct {
	suffix string
	kind   events.ResourceKind
}{{".sock", events.KindAPISocket}, {".sock.lock", events.KindAPISocketLock}, {".vsock", events.KindVsockSocket}, {".iid", events.KindIIDSocket}}

// logSuffixes are a sandbox's logs in logs/ (VMMLog, SupervisorLog,
// ConsoleLog, ConsoleIndex).
var logSuffixes = []string{".vmm.log", ".supervisor.log", ".console.log", ".console.idx"}

// sandboxDirs are the directories whose entries are named by a ULID alone.
var sandboxDirs = map[string]events.ResourceKind{
	"supervisors":         events.KindSupervisorState,
	"builder-supervisors": events.KindBuilderSupervisor,
	"snapshots":           events.KindSnapshot,
	"sandboxes":           events.KindRecord,
}

// Parse names rel, a path relative to the state root. ok is false unless
// rel is clean and is an entry directly inside one of Dirs; a name there
// that matches no pattern is ok with Unparsed set. rel is read as a file
// (see ParseEntry).
func Parse(rel string) (n Name, ok bool) {
	if rel == "" || filepath.IsAbs(rel) || filepath.Clean(rel) != rel {
		return Name{}, false
	}
	dir, name, cut := strings.Cut(rel, "/")
	if !cut || strings.Contains(name, "/") || !isDir(dir) {
		return Name{}, false
	}
	return ParseEntry(dir, name, false), true
}

func isDir(dir string) bool {
	for _, d := range Dirs {
		if d == dir {
			return true
		}
	}
	return false
}

// ParseEntry names the entry name found directly in dir, one of Dirs;
// isDir says it is a directory (a log is a file, so a directory of a log's
// name does not parse).
func ParseEntry(dir, name string, isDir bool) Name {
	switch dir {
	case "disks":
		return parseDisk(name)
	case "run":
		if rest, ok := strings.CutPrefix(name, socketPrefix); ok {
			for _, s := range sockets {
				if id, cut := strings.CutSuffix(rest, s.suffix); cut && IsULID(id) {
					return Name{Kind: s.kind, ID: id}
				}
			}
		}
		return Name{Kind: events.KindAPISocket, Unparsed: true}
	case "logs":
		if run, ok := WatchdogLogRun(name); ok {
			return Name{Kind: events.KindWatchdogLog, Run: run, Unparsed: !ValidRunID(run) || isDir}
		}
		for _, suffix := range logSuffixes {
			if id, cut := strings.CutSuffix(name, suffix); cut && IsULID(id) && !isDir {
				return Name{Kind: events.KindLog, ID: id}
			}
		}
		return Name{Kind: events.KindLog, Unparsed: true}
	}
	n := Name{Kind: sandboxDirs[dir]}
	if IsULID(name) {
		n.ID = name
	} else {
		n.Unparsed = true
	}
	return n
}

func parseDisk(name string) Name {
	// A staged intent is flocked before it is renamed into place, so it is
	// read as the final name.
	if final, ok := stagedName(name); ok {
		if n := parseIntent(final); n.Kind != "" {
			n.Staged = true
			return n
		}
	}
	if n := parseIntent(name); n.Kind != "" {
		return n
	}
	for _, s := range []struct {
		suffix string
		kind   events.ResourceKind
	}{{rawSuffix, events.KindRawDisk}, {workspaceSuffix, events.KindWorkspaceDisk}, {overlayStagingSuffix, events.KindOverlayStaging}} {
		if id, ok := strings.CutSuffix(name, s.suffix); ok && IsULID(id) {
			return Name{Kind: s.kind, ID: id}
		}
	}
	if strings.HasSuffix(name, legacyShadowSuffix) && len(name) > len(legacyShadowSuffix) {
		return Name{Kind: events.KindShadowDisk, Legacy: true}
	}
	if n, ok := parseShadowDisk(name); ok {
		return n
	}
	return Name{Kind: events.KindRawDisk, Unparsed: true}
}

// MayBeIntent reports whether name, found in disks/, can be a create or
// shadow intent, final or staged: every name parseDisk reads as an intent
// holds one of the two suffixes. A caller looking for intents among a
// directory's names parses only these.
func MayBeIntent(name string) bool {
	return strings.Contains(name, createIntentSuffix) || strings.Contains(name, shadowIntentSuffix)
}

// stagedName is the final name in a staged name (".<final>.stage-XXXX").
func stagedName(name string) (string, bool) {
	i := strings.LastIndex(name, stageInfix)
	if !strings.HasPrefix(name, ".") || i <= 1 {
		return "", false
	}
	return name[1:i], true
}

// parseIntent reads a create or shadow intent's name; Kind is "" for any
// other name.
func parseIntent(name string) Name {
	if id, ok := strings.CutSuffix(name, createIntentSuffix); ok && IsULID(id) {
		return Name{Kind: events.KindCreateIntent, ID: id}
	}
	if safe, ok := strings.CutSuffix(name, shadowIntentSuffix); ok && safe != "" {
		if _, ok := HandleOf(safe); !ok {
			return Name{Kind: events.KindShadowIntent, Unparsed: true} // no handle maps to this name
		}
		return Name{Kind: events.KindShadowIntent, Handle: safe}
	}
	return Name{}
}

// parseShadowDisk reads <safeHandle>.shadow.<name>.ext4 (a create's) and
// <childULID>-<parentSafeHandle>.shadow.<name>.ext4 (a fork or restore
// child's copy). A shadow name holds no '.', but a handle may hold
// ".shadow.", so the split is at the last one. A ULID never holds '-', so
// the child's prefix is unique (and lifecycle refuses a handle that starts
// <ULID>-, see ForkPrefixed).
func parseShadowDisk(name string) (Name, bool) {
	rest, ok := strings.CutSuffix(name, ext4Suffix)
	i := strings.LastIndex(rest, shadowInfix)
	if !ok || i < 0 {
		return Name{}, false
	}
	n := Name{Kind: events.KindShadowDisk, Shadow: rest[i+len(shadowInfix):]}
	key := rest[:i]
	if id, parent, ok := ForkPrefixed(key); ok {
		n.ID, n.Parent = id, parent
		key = parent
	} else {
		n.Handle = key
	}
	if _, ok := HandleOf(key); !ok || !validShadowName(n.Shadow) {
		return Name{Kind: events.KindShadowDisk, Unparsed: true}, true // no handle maps to this name
	}
	return n, true
}

// ForkPrefixed splits s as <ULID>-<rest>, the start of a fork or restore
// child's shadow copy; ok is false for any other s.
func ForkPrefixed(s string) (id, rest string, ok bool) {
	if len(s) > 27 && s[26] == '-' && IsULID(s[:26]) {
		return s[:26], s[27:], true
	}
	return "", "", false
}

// validShadowName holds for a shadow name a disk's name can carry back:
// not empty and without '.' (lifecycle's names are [a-z0-9_-]).
func validShadowName(name string) bool {
	return name != "" && !strings.Contains(name, ".")
}
