// Package layout names every path under a state root. It is pure: it
// computes names and parses them back, and never touches the filesystem.
// The names are the public contract in SPEC.md.
package layout

import (
	"path/filepath"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

// Root is an absolute state root.
type Root string

func (r Root) join(parts ...string) string {
	return filepath.Join(append([]string{string(r)}, parts...)...)
}

func (r Root) Journal() string     { return r.join("journal") }
func (r Root) Disks() string       { return r.join("disks") }
func (r Root) RunDir() string      { return r.join("run") }
func (r Root) Supervisors() string { return r.join("supervisors") }
func (r Root) Builders() string    { return r.join("builder-supervisors") }
func (r Root) Snapshots() string   { return r.join("snapshots") }
func (r Root) Images() string      { return r.join("images") }
func (r Root) Volumes() string     { return r.join("volumes") }
func (r Root) Records() string     { return r.join("sandboxes") }
func (r Root) Logs() string        { return r.join("logs") }

// HostID holds the host's fleet identity, a ULID minted once (host/hostid).
func (r Root) HostID() string { return r.join("host-id") }

func (r Root) Record(id string) string        { return r.join("sandboxes", id, "record.json") }
func (r Root) RawDisk(id string) string       { return r.join("disks", id+".raw") }
func (r Root) WorkspaceDisk(id string) string { return r.join("disks", id+"-workspace.ext4") }
func (r Root) CreateIntent(id string) string  { return r.join(CreateIntentRel(id)) }

// CreateIntentRel is CreateIntent relative to the root, as leases are keyed.
func CreateIntentRel(id string) string { return filepath.Join("disks", id+createIntentSuffix) }

// OverlayStaging is the private copy an overlay recovery repairs and grows
// before renaming it over WorkspaceDisk (same directory, so the rename is
// atomic).
func (r Root) OverlayStaging(id string) string { return r.join("disks", id+".overlay-staging.ext4") }

func (r Root) APISocket(id string) string   { return r.join("run", "sb-"+id+".sock") }
func (r Root) VsockSocket(id string) string { return r.join("run", "sb-"+id+".vsock") }

// APISocketLock is the file Cloud Hypervisor v53+ locks beside its API
// socket, and leaves behind when it exits.
func (r Root) APISocketLock(id string) string { return r.APISocket(id) + ".lock" }
func (r Root) IIDSocket(id string) string     { return r.join("run", "sb-"+id+".iid") }
func (r Root) SupervisorDir(id string) string { return r.join("supervisors", id) }
func (r Root) BuilderDir(id string) string    { return r.join("builder-supervisors", id) }
func (r Root) SnapshotsOf(id string) string   { return r.join("snapshots", id) }
func (r Root) Snapshot(id, snap string) string {
	return r.join("snapshots", id, snap)
}
func (r Root) VMMLog(id string) string        { return r.join("logs", id+".vmm.log") }
func (r Root) SupervisorLog(id string) string { return r.join("logs", id+".supervisor.log") }

// ConsoleLog is the guest's serial console (its kernel log), which the VMM
// writes; kept with the other logs.
func (r Root) ConsoleLog(id string) string { return r.join("logs", id+".console.log") }

// ConsoleIndex holds the times the console log grew: the supervisor
// records the log's size about once a second, so `nexus logs` can place a
// console line in time (host/logindex). It is one of the sandbox's logs.
func (r Root) ConsoleIndex(id string) string { return r.join("logs", id+".console.idx") }

// WatchdogLog is the log of client run run's watchdog (its stdout and
// stderr), beside the sandboxes' logs; the ledger removes it with the run.
func (r Root) WatchdogLog(run string) string { return r.join("logs", WatchdogLogName(run)) }

const watchdogLogPrefix, watchdogLogSuffix = "run-", ".watchdog.log"

// WatchdogLogName is the name of run's watchdog log in logs/.
func WatchdogLogName(run string) string { return watchdogLogPrefix + run + watchdogLogSuffix }

// WatchdogLogRun is the run a name in logs/ is the watchdog log of; ok is
// false for a name of another shape. The run is not validated.
func WatchdogLogRun(name string) (run string, ok bool) {
	run, ok = strings.CutPrefix(name, watchdogLogPrefix)
	if !ok {
		return "", false
	}
	return strings.CutSuffix(run, watchdogLogSuffix)
}

// SafeHandle is a handle usable in a file name: "/" becomes "_" (SPEC.md)
// and "_" itself becomes "+", a character no handle may contain, so the
// mapping is injective: "a/b" is "a_b" and "a_b" is "a+b". A one-character
// escape keeps the longest handle's names within NAME_MAX, which "%5F"
// would not. HandleOf reverses it.
func SafeHandle(handle string) string { return safeHandle.Replace(handle) }

var (
	safeHandle   = strings.NewReplacer("_", "+", "/", "_")
	unsafeHandle = strings.NewReplacer("+", "_", "_", "/")
)

// HandleOf parses a safe handle found in a file name back into the handle
// it was made from. ok is false for a name with a character outside the
// safe alphabet [A-Za-z0-9.+_-], or empty; lifecycle's other handle rules
// (first character, no "..") are not rechecked here.
func HandleOf(safe string) (handle string, ok bool) {
	if safe == "" {
		return "", false
	}
	for _, c := range safe {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '.', c == '+', c == '_', c == '-':
		default:
			return "", false
		}
	}
	return unsafeHandle.Replace(safe), true
}

func (r Root) ShadowDisk(handle, name string) string {
	return r.join("disks", SafeHandle(handle)+".shadow."+name+".ext4")
}

// ShadowName is the shadow name in a ShadowDisk or ForkShadowDisk path.
func ShadowName(path string) (string, bool) {
	n := ParseEntry("disks", filepath.Base(path), false)
	return n.Shadow, n.Kind == events.KindShadowDisk && n.Shadow != ""
}

func (r Root) ShadowIntent(handle string) string { return r.join(ShadowIntentRel(SafeHandle(handle))) }

// ShadowIntentRel is the shadow intent of a safe handle (Name.Handle)
// relative to the root, as leases are keyed.
func ShadowIntentRel(safeHandle string) string {
	return filepath.Join("disks", safeHandle+shadowIntentSuffix)
}

// ForkShadowDisk is a fork or restore child's copy of a parent's shadow
// disk; the child's ULID prefix makes it the child's.
func (r Root) ForkShadowDisk(child, parentHandle, name string) string {
	return r.join("disks", child+"-"+SafeHandle(parentHandle)+".shadow."+name+".ext4")
}

func (r Root) VolumeDir(name string) string  { return r.join("volumes", name) }
func (r Root) VolumeDisk(name string) string { return r.join("volumes", name, "disk.ext4") }

// Rel is path relative to the root, as events record it, so a journal
// copied elsewhere still describes its own tree.
func (r Root) Rel(path string) string {
	rel, err := filepath.Rel(string(r), path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return path
	}
	return rel
}

// Abs turns an event's relative path back into a path under r.
func (r Root) Abs(rel string) string {
	if filepath.IsAbs(rel) {
		return rel
	}
	return r.join(rel)
}

// IsULID reports whether s is a canonical sandbox id.
func IsULID(s string) bool {
	_, err := ulid.ParseStrict(s)
	return err == nil && strings.ToUpper(s) == s
}
