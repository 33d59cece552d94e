package core

import "errors"

// ErrIncomplete marks a prune refused because a sandbox-producing saga is
// open: the sandbox it leaves, and the entry it references, are unknown.
var ErrIncomplete = errors.New("incomplete sandbox state")
