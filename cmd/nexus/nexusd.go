//go:build nexusd

// A binary built with -tags nexusd is nexusd: the daemon, the store opened
// in process, the journal readers, the fleet adapter, and every command of the CLI
// besides, so the CLI (built without the tag; see nexusd_cli.go) hands it
// any command that needs them.
package main

import (
	"errors"
	"os"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/local"
)

// inProcess opens the store in this process.
func inProcess() control.InProcess { return local.InProcess{} }

// daemonBinary is the binary that runs the daemon and the sandboxes'
// processes: this one.
func daemonBinary() (string, error) { return os.Executable() }

// identify: this process is the daemon's binary itself.
func identify() {}

// inNexusd returns err: this process is nexusd already.
func inNexusd(err error) error { return err }

// journalHint is what an error's damaged journal block lets the operator do.
func journalHint(err error) string {
	if ce := (*local.CorruptError)(nil); errors.As(err, &ce) {
		return "; if only the end of the last block is torn, `nexus journal repair --backup DIR` copies the store aside and cuts it"
	}
	return ""
}
