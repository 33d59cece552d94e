// Package wire is the daemon's control protocol, shared by the daemon and
// its clients: the socket's name, the HTTP paths and their answers, the
// events query as URL parameters, a daemon's build identity, and the
// append stream's frames (stream.go).
package wire

import (
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
)

// SocketName is the daemon's control socket, directly under the state root.
const SocketName = "nexus.sock"

// The daemon's HTTP paths. Each GET answers JSON; the query parameters a
// path reads are named beside it.
const (
	PathStatus = "/v1/status" // Status
	PathStats  = "/v1/stats"  // Stats
	PathMirror = "/v1/mirror" // MirrorAnswer
	// PathRetire (POST) asks a daemon started on demand to retire.
	PathRetire = "/v1/retire"
	// PathStop (POST, a StopRequest) asks any daemon to finish with the
	// commands it has and exit.
	PathStop = "/v1/stop"
	// PathAppendJSON (POST) is where an older client posted appends; it is
	// refused with AppendOverHTTPRefusal in an ErrorAnswer.
	PathAppendJSON = "/v1/append"
	// PathAppendStream (POST, upgraded) carries appends (stream.go).
	PathAppendStream  = "/v1/append-stream"
	PathEvents        = "/v1/events"         // ParseQuery's parameters; one Record a line
	PathSandboxes     = "/v1/sandboxes"      // after, limit (none: every sandbox); []Sandbox
	PathListJSON      = "/v1/sandboxes.json" // after, limit (0: all); the bytes of `ls --json`, streamed
	PathSandbox       = "/v1/sandbox"        // ref; SandboxAnswer
	PathNamed         = "/v1/named"          // ref; []projections.Ref
	PathWithProcesses = "/v1/with-processes" // []Sandbox: those that record a process
	PathOwner         = "/v1/owner"          // path (repeated), except; OwnerAnswer
	PathSnapshotOwner = "/v1/snapshot-owner" // snap; SandboxAnswer
	PathPathOwners    = "/v1/path-owners"    // POST: paths in the body, owners a line (paths.go)
	PathVolumes       = "/v1/volumes"        // []projections.Volume
	PathImageCache    = "/v1/imagecache"     // projections.ImageCacheState
	PathBootstrap     = "/v1/bootstrap"      // id; events.Bootstrap
	PathSagas         = "/v1/sagas"          // []projections.OpenSaga
	PathRev           = "/v1/rev"            // entity; RevAnswer
	// PathSnapshotsNamed (ref) answers []projections.SnapshotRef: the
	// snapshots ref could name, for projections.MatchSnapshot.
	PathSnapshotsNamed = "/v1/snapshots-named"
	// PathMetrics is the daemon's Prometheus metrics, in the text
	// exposition format (docs/metrics.md).
	PathMetrics = "/metrics"
	// PathIdentity is what a client asks first on every connection: the
	// root the daemon serves (RootIdentity).
	PathIdentity = "/v1/identity"
)

// RootIdentity names the state root a daemon serves: the directory's
// device and inode as the daemon opened it, and the path it was given.
// Two roots are the same directory only if device and inode agree; the
// path is for people.
type RootIdentity struct {
	Root string `json:"root"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
	Pid  int    `json:"pid"`
	// Status is the daemon's Status as it answers PathStatus, so that a
	// new connection's first exchange also says whether this daemon
	// serves the command. An older daemon sends none; its client asks
	// PathStatus.
	Status *Status `json:"status,omitempty"`
}

// Same reports whether a and b name one directory.
func (a RootIdentity) Same(b RootIdentity) bool { return a.Dev == b.Dev && a.Ino == b.Ino }

func (a RootIdentity) String() string {
	return fmt.Sprintf("%s (device %d, inode %d)", a.Root, a.Dev, a.Ino)
}

// Status describes a running daemon.
type Status struct {
	Pid           int    `json:"pid"`
	Root          string `json:"root"`
	SubscriberURL string `json:"subscriber_url,omitempty"`
	// Auto is a daemon started on demand: it exits when idle and retires
	// when a command needs the journal in its own process.
	Auto bool `json:"auto,omitempty"`
	// Build is the executable the daemon runs; an older daemon sends none,
	// which no client takes for its own.
	Build *Build `json:"build,omitempty"`
	// Retiring is a daemon asked to retire: it still serves the commands
	// that were talking to it, new connections of theirs included, and
	// every other client goes elsewhere.
	Retiring bool `json:"retiring,omitempty"`
	// Fleet is the fingerprint of the fleet settings the daemon mirrors
	// with (fleet.Mirror.Fingerprint; empty: it mirrors nothing). A
	// command whose configuration gives another replaces an on-demand
	// daemon as it replaces one of another build.
	Fleet string `json:"fleet,omitempty"`
}

// Stats counts what the daemon has served since it started. Sandboxes is
// every sandbox record it encoded into a response (a list counts each
// member, the image cache each user): a single-sandbox command must move
// it by a bounded number, whatever the number of sandboxes in the root,
// and tests assert that through it.
type Stats struct {
	Sandboxes int64 `json:"sandboxes_encoded"`
	// MostInOneAnswer is the most sandbox records one answer held: a
	// paged `ls` keeps it at its page size.
	MostInOneAnswer int64 `json:"most_in_one_answer"`
	// Decoded is how many records the daemon's store has decoded from
	// its file since it opened (store.Decoded).
	Decoded uint64 `json:"records_decoded"`
}

// Record carries one event as its journal bytes, so the client decodes
// with the same code, and the same errors, as a local reader. A line with
// Error set ends the stream with that error.
type Record struct {
	Seq   uint64 `json:"seq,omitempty"`
	Data  []byte `json:"data,omitempty"`
	Error string `json:"error,omitempty"`
}

// MirrorAnswer is the daemon's fleet mirror (nil: it mirrors nothing).
type MirrorAnswer struct {
	Mirror *fleetstate.MirrorState `json:"mirror"`
}

// RevAnswer is the sequence of the last event about an entity (0: none).
type RevAnswer struct {
	Rev uint64 `json:"rev"`
}

// SandboxAnswer is one sandbox, or Found false.
type SandboxAnswer struct {
	Found   bool    `json:"found"`
	Sandbox Sandbox `json:"sandbox"`
}

// OwnerAnswer names the sandbox owning a path, or Found false.
type OwnerAnswer struct {
	Found   bool   `json:"found"`
	Sandbox string `json:"sandbox,omitempty"`
	Path    string `json:"path,omitempty"`
}

// OpenFailedHeader marks the answer of a daemon whose journal failed to
// open after it had begun answering the sandbox store's reads early: its
// ErrorAnswer is the open's error, the one a command opening the root
// itself fails with, and the daemon answers every request so until its
// commands are gone.
const OpenFailedHeader = "Nexus-Open-Failed"

// ErrorAnswer is a refusal; its field is the one an older client's append
// answer carried its error in, so that client prints it.
type ErrorAnswer struct {
	Error string `json:"error,omitempty"`
}

// QueryValues is q as PathEvents's parameters; ParseQuery reads them back.
func QueryValues(q events.Query) url.Values {
	v := url.Values{}
	seq := func(k string, n uint64) {
		if n > 0 {
			v.Set(k, strconv.FormatUint(n, 10))
		}
	}
	at := func(k string, t time.Time) {
		if !t.IsZero() {
			v.Set(k, t.UTC().Format(time.RFC3339Nano))
		}
	}
	seq("since", q.Since)
	seq("until", q.Until)
	at("since_time", q.SinceTime)
	at("until_time", q.UntilTime)
	if q.Tail > 0 {
		v.Set("tail", strconv.Itoa(q.Tail))
	}
	if q.Sandbox != "" {
		v.Set("sandbox", q.Sandbox)
	}
	for _, t := range append([]string{q.Type}, q.Types...) {
		if t != "" {
			v.Add("type", t)
		}
	}
	if q.Follow {
		v.Set("follow", "1")
	}
	return v
}

// ParseQuery reads the query QueryValues wrote.
func ParseQuery(v url.Values) (events.Query, error) {
	q := events.Query{Sandbox: v.Get("sandbox"), Types: v["type"], Follow: v.Get("follow") == "1"}
	for k, p := range map[string]*uint64{"since": &q.Since, "until": &q.Until} {
		if s := v.Get(k); s != "" {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return q, fmt.Errorf("%s %q: not a sequence number", k, s)
			}
			*p = n
		}
	}
	for k, p := range map[string]*time.Time{"since_time": &q.SinceTime, "until_time": &q.UntilTime} {
		if s := v.Get(k); s != "" {
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return q, fmt.Errorf("%s %q: not an RFC 3339 time", k, s)
			}
			*p = t
		}
	}
	if s := v.Get("tail"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return q, fmt.Errorf("tail %q: not a count", s)
		}
		q.Tail = n
	}
	return q, nil
}

// StopRequest names who asked a daemon to stop, for its log.
type StopRequest struct {
	Pid int `json:"pid"`
}
