// Package hostid owns this host's fleet identity: a ULID minted once into
// the state root and kept for its life, so two hosts (cloned machines with
// one hostname included) never pass for one in the fleet.
package hostid

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/layout"
)

// Load returns the root's host identity, minting it on first use. Minting
// publishes without replacing, so two processes starting at once agree on
// the first one written; a damaged file is an error, never re-minted, since
// a new identity would orphan the host's mirror on the fleet.
func Load(root string) (ulid.ULID, error) {
	path := layout.Root(root).HostID()
	for range 2 {
		data, err := fsx.ReadFile(root, path)
		if err == nil {
			id, perr := ulid.ParseStrict(strings.TrimSpace(string(data)))
			if perr != nil {
				return ulid.ULID{}, fmt.Errorf("host identity %s is damaged (%q): restore it from a backup; a new one would be another host to the fleet", path, data)
			}
			return id, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return ulid.ULID{}, fmt.Errorf("host identity: %w", err)
		}
		id := ulid.Make()
		err = fsx.WriteNew(root, path, []byte(id.String()+"\n"), 0o600)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return ulid.ULID{}, fmt.Errorf("host identity: %w", err)
		}
		// Another process minted it first: read theirs.
	}
	return ulid.ULID{}, fmt.Errorf("host identity %s: appeared and vanished", path)
}
