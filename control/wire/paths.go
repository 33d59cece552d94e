package wire

import (
	"errors"
	"strings"
)

// A PathPathOwners request's body is the paths, each ended by a NUL byte
// (the one byte no path holds), as many as PathOwnersBatch; its answer is
// one line per path, in order: the owning sandbox's ID, or an empty line
// for none (PathOwnersType). Nothing is escaped either way, so the daemon
// reads a batch with one allocation and writes its answer into one
// buffer.
const (
	PathOwnersBatch = 4096
	// PathOwnersMaxBody bounds a request's body: a batch of paths of
	// PATH_MAX.
	PathOwnersMaxBody = PathOwnersBatch * 4096
	PathOwnersType    = "text/plain; charset=utf-8"
)

// PathOwnersOverGETRefusal answers a client that still asks for path
// owners in a URL query.
const PathOwnersOverGETRefusal = "this nexus daemon takes path-owner lookups only as a POST body; the command is from an older nexus: use the nexus binary the daemon runs, or stop the daemon"

// ErrPathHasNUL is a path no lookup can carry (and no file can have).
var ErrPathHasNUL = errors.New("path holds a NUL byte")

// AppendPaths is dst with paths encoded as a PathPathOwners body.
func AppendPaths(dst []byte, paths []string) ([]byte, error) {
	for _, p := range paths {
		if strings.IndexByte(p, 0) >= 0 {
			return nil, ErrPathHasNUL
		}
		dst = append(append(dst, p...), 0)
	}
	return dst, nil
}

// SplitPaths is the paths of a PathPathOwners body, each a slice of body
// (not a copy); a body whose last path is not ended is refused.
func SplitPaths(body string) ([]string, error) {
	if body == "" {
		return nil, nil
	}
	if body[len(body)-1] != 0 {
		return nil, errors.New("path-owners body: the last path is not ended by a NUL byte")
	}
	out := make([]string, 0, strings.Count(body, "\x00"))
	for body != "" {
		i := strings.IndexByte(body, 0)
		out = append(out, body[:i])
		body = body[i+1:]
	}
	return out, nil
}

// SplitOwners is the owners of a PathPathOwners answer for n paths.
func SplitOwners(answer string, n int) ([]string, error) {
	if n == 0 && answer == "" {
		return nil, nil
	}
	if !strings.HasSuffix(answer, "\n") || strings.Count(answer, "\n") != n {
		return nil, errors.New("path-owners answer: not one line per path")
	}
	return strings.Split(answer[:len(answer)-1], "\n"), nil
}
