package wire

import (
	"cmp"
	"fmt"
	"runtime/debug"
	"strings"
	"time"
)

// Stamp is what the Go toolchain embedded in a build: the main module's
// version ("devel" for a build outside a released module), and the
// revision, its time and whether the work tree was modified, when the
// build was made from a VCS checkout.
type Stamp struct {
	Version    string
	Revision   string
	Modified   bool
	CommitTime string
}

// StampOf reads the stamp from a build's information.
func StampOf(bi *debug.BuildInfo) Stamp {
	st := Stamp{Version: bi.Main.Version}
	if st.Version == "" || st.Version == "(devel)" {
		st.Version = "devel"
	}
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			st.Revision = kv.Value
		case "vcs.modified":
			st.Modified = kv.Value == "true"
		case "vcs.time":
			st.CommitTime = kv.Value
		}
	}
	return st
}

// Build identifies the nexus executable a process runs. A daemon and a
// command agree only if they run the same file: replacing the binary (an
// upgrade) gives the new one another inode, size or mtime, even when the
// version stamped in it is the same (a local build, a rebuilt tag). The
// version and revision are for people; Same never looks at them.
type Build struct {
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"inode"`
	Size    int64  `json:"size_bytes"`
	MtimeNs int64  `json:"mtime_ns"`
	// Path is where the executable was when the process started; an
	// upgraded binary shows " (deleted)" after it.
	Path     string `json:"path,omitempty"`
	Version  string `json:"version,omitempty"`
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

// Same is whether b and o are the same executable file.
func (b Build) Same(o Build) bool {
	return b.Dev == o.Dev && b.Ino == o.Ino && b.Size == o.Size && b.MtimeNs == o.MtimeNs
}

// String is the one-line form: "devel rev 0123abcd4567 (/usr/bin/nexus,
// inode 1234, 5678 bytes, 2026-12-04T21:55:54Z)".
func (b Build) String() string {
	var s strings.Builder
	s.WriteString(cmp.Or(b.Version, "unknown"))
	if b.Revision != "" {
		fmt.Fprintf(&s, " rev %.12s", b.Revision)
		if b.Modified {
			s.WriteString("+")
		}
	}
	fmt.Fprintf(&s, " (%s, inode %d, %d bytes, %s)", cmp.Or(b.Path, "?"), b.Ino, b.Size,
		time.Unix(0, b.MtimeNs).UTC().Format(time.RFC3339))
	return s.String()
}
