package control

import (
	"github.com/nexus-sandbox/nexus/host/fsx"
)

// ErrStateRoot means the state root cannot be used as given.
var ErrStateRoot = fsx.ErrStateRoot

// PrepareRoot makes the state root if it is missing and returns its
// absolute path, refusing one that others can write, that belongs to
// another user or that cannot be written (ErrStateRoot).
func PrepareRoot(root string) (string, error) { return fsx.PrepareRoot(root) }
