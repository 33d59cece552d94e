package main

import (
	"debug/buildinfo"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/nexus-sandbox/nexus/control/wire"
)

// version may be set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version the Go toolchain stamped is used.
var version = ""

// versionInfo is what `nexus version` reports. Everything but Version comes
// from the build information the Go toolchain embeds, so a binary cannot
// claim a revision it was not built from.
type versionInfo struct {
	Version    string `json:"version"`
	Revision   string `json:"revision,omitempty"`
	Modified   bool   `json:"modified"`
	CommitTime string `json:"commit_time,omitempty"`
	Go         string `json:"go"`
	NATSServer string `json:"nats_server,omitempty"`
}

const natsServerModule = "github.com/nats-io/nats-server/v2"

func readVersion() versionInfo {
	v := versionInfo{Version: version}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if v.Version == "" {
			v.Version = "unknown"
		}
		return v
	}
	v.Go = bi.GoVersion
	st := wire.StampOf(bi)
	v.Revision, v.Modified, v.CommitTime = st.Revision, st.Modified, st.CommitTime
	if v.Version == "" {
		v.Version = st.Version
	}
	v.NATSServer = natsServerOf(bi)
	if v.NATSServer == "" {
		// The CLI links no nats-server: the journal's is nexusd's, read
		// from the build information in its file, without running it.
		if exe, err := daemonBinary(); err == nil {
			if dbi, err := buildinfo.ReadFile(exe); err == nil {
				v.NATSServer = natsServerOf(dbi)
			}
		}
	}
	return v
}

// natsServerOf is the nats-server module version linked into a build.
func natsServerOf(bi *debug.BuildInfo) string {
	for _, d := range bi.Deps {
		if d.Path == natsServerModule {
			if d.Replace != nil {
				d = d.Replace
			}
			return d.Version
		}
	}
	return ""
}

// String is the one-line form: "nexus devel (rev 0123abcd4567, modified) go1.26 nats-server v2.12.0".
func (v versionInfo) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nexus %s", v.Version)
	if v.Revision != "" {
		rev := v.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		fmt.Fprintf(&b, " (rev %s", rev)
		if v.Modified {
			b.WriteString(", modified")
		}
		b.WriteString(")")
	}
	if v.Go != "" {
		fmt.Fprintf(&b, " %s", v.Go)
	}
	if v.NATSServer != "" {
		fmt.Fprintf(&b, " nats-server %s", v.NATSServer)
	}
	return b.String()
}
