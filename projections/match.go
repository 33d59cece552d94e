package projections

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// MinPrefix is the shortest ID prefix a reference may be: shorter ones
// would match almost anything by accident (every ULID of a year shares its
// first characters).
const MinPrefix = 4

// ShortLen is the length of a short ID.
const ShortLen = 12

// ShortID is the short form of a sandbox or snapshot ID that tables show:
// the first ShortLen hex digits of the SHA-256 of the ID (upper case, as
// ULIDs are written). A ULID's first characters are its timestamp, so
// sandboxes made together (a fork's children) share them; its random part
// is incremented, not redrawn, within one millisecond, so its head is
// shared as well. A hash of the whole ID differs for any two IDs. Match
// accepts it, or a prefix of it, wherever an ID is accepted.
func ShortID(id string) string {
	sum := sha256.Sum256([]byte(strings.ToUpper(id)))
	return hex.EncodeToString(sum[:])[:ShortLen]
}

// ErrNoMatch: no sandbox answers to the reference.
var ErrNoMatch = errors.New("no sandbox")

// AmbiguousError: the reference is a prefix of several IDs. It names them
// all so the operator can pick one.
type AmbiguousError struct {
	Ref        string
	What       string // "sandboxes" or "snapshots"
	Candidates []string
}

func (e *AmbiguousError) Error() string {
	return fmt.Sprintf("%q matches %d %s: %s", e.Ref, len(e.Candidates), e.What, strings.Join(e.Candidates, ", "))
}

// Ref is what a reference can name: an ID and, optionally, a handle.
type Ref struct{ ID, Handle string }

// Match is the one rule for turning what an operator typed into a sandbox
// ID, in docker's order: an exact ID (any case, ULIDs are case-free), then
// an exact handle, then a unique prefix of at least MinPrefix characters
// of an ID or of a short ID (ShortID, any case; a whole short ID is its
// own prefix). A handle wins over a prefix because the operator chose it.
// A prefix that names two sandboxes, whether by their IDs or their short
// IDs, is ambiguous. It returns the matched ID, ErrNoMatch, or an
// *AmbiguousError.
func Match(refs []Ref, ref string) (string, error) {
	if ref == "" {
		return "", fmt.Errorf("%w %q", ErrNoMatch, ref)
	}
	upper := strings.ToUpper(ref)
	for _, r := range refs {
		if r.ID == upper {
			return r.ID, nil
		}
	}
	for _, r := range refs {
		if r.Handle != "" && r.Handle == ref {
			return r.ID, nil
		}
	}
	found := IDsNamedBy(refs, ref)
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%w %q", ErrNoMatch, ref)
	case 1:
		return found[0], nil
	}
	return "", &AmbiguousError{Ref: ref, What: "sandboxes", Candidates: found}
}

// MatchSandbox applies Match to a list of sandboxes.
func MatchSandbox(list []Sandbox, ref string) (Sandbox, error) {
	refs := make([]Ref, len(list))
	for i, sb := range list {
		refs[i] = Ref{ID: sb.ID, Handle: sb.Handle}
	}
	id, err := Match(refs, ref)
	if err != nil {
		return Sandbox{}, err
	}
	for _, sb := range list {
		if sb.ID == id {
			return sb, nil
		}
	}
	return Sandbox{}, fmt.Errorf("%w %q", ErrNoMatch, ref)
}

// SnapshotRef is a snapshot a reference could name: its ID and the
// sandbox holding it.
type SnapshotRef struct{ ID, Sandbox string }

// MatchSnapshot is Match over snapshot IDs (ULIDs too, named as sandbox
// IDs are: exactly, or by a unique prefix of the ID or of its short ID,
// any case; a snapshot has no handle): the snapshot among refs that ref
// names, ErrNoMatch, or an *AmbiguousError of "snapshots". refs are the
// candidates a view gives for ref (SnapshotsNamed, or a store's seek in
// its snapshot indexes); a snapshot two sandboxes hold is one candidate.
func MatchSnapshot(refs []SnapshotRef, ref string) (string, error) {
	ids := make([]Ref, len(refs))
	for i, r := range refs {
		ids[i] = Ref{ID: r.ID}
	}
	id, err := Match(ids, ref)
	var amb *AmbiguousError
	if errors.As(err, &amb) {
		amb.What = "snapshots"
	}
	return id, err
}

// ulidAlphabet is Crockford's base32, the characters a ULID is written in.
const ulidAlphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// IDsNamedBy lists the IDs among refs that ref names by Match's ID rules
// alone (an exact ID, or a prefix of at least MinPrefix characters of an
// ID or of a short ID, any case), whatever handles say, in refs' order.
// A new handle that names any is refused: Match would then give the
// handle's sandbox for a prefix the operator took from another sandbox's
// ID. A ref that cannot be an ID
// prefix (too short, or a character no ULID has) names none, and refs is
// then not read, so a caller may skip fetching it (IDPrefixLike).
func IDsNamedBy(refs []Ref, ref string) []string {
	if !IDPrefixLike(ref) {
		return nil
	}
	upper, lower := strings.ToUpper(ref), strings.ToLower(ref)
	var out []string
	seen := map[string]bool{}
	for _, r := range refs {
		if !seen[r.ID] && (strings.HasPrefix(r.ID, upper) || strings.HasPrefix(ShortID(r.ID), lower)) {
			seen[r.ID] = true
			out = append(out, r.ID)
		}
	}
	return out
}

// IDPrefixLike reports whether ref could be an ID prefix Match accepts
// (a short ID's hex digits are ULID characters too).
func IDPrefixLike(ref string) bool {
	if len(ref) < MinPrefix {
		return false
	}
	for _, c := range strings.ToUpper(ref) {
		if !strings.ContainsRune(ulidAlphabet, c) {
			return false
		}
	}
	return true
}

// Named is the refs of the view's sandboxes that ref could name by Match:
// the handle's holder and those IDsNamedBy names. A store asks it of the
// overlay it keeps over its records, which holds only the sandboxes
// touched since its last checkpoint; its records answer from their own
// indexes.
func (s *Sandboxes) Named(ref string) []Ref {
	var out []Ref
	if sb := s.ByHandle(ref); sb != nil {
		out = append(out, Ref{ID: sb.ID, Handle: sb.Handle})
	}
	if !IDPrefixLike(ref) {
		return out
	}
	all := make([]Ref, 0, len(s.byID))
	for _, sb := range s.List() {
		all = append(all, Ref{ID: sb.ID})
	}
	for _, id := range IDsNamedBy(all, ref) {
		out = append(out, Ref{ID: id, Handle: s.byID[id].Handle})
	}
	return out
}

// SnapshotsNamed is the snapshots of the view that ref could name by
// MatchSnapshot, in snapshot ID order, each with the sandbox that
// SnapshotOwner gives for it. A store asks it of its overlay, as Named;
// its records answer from the snapshot indexes.
func (s *Sandboxes) SnapshotsNamed(ref string) []SnapshotRef {
	if !IDPrefixLike(ref) {
		return nil
	}
	all := make([]Ref, 0, len(s.snaps.one))
	for snap := range s.snaps.one {
		all = append(all, Ref{ID: snap})
	}
	slices.SortFunc(all, func(a, b Ref) int { return strings.Compare(a.ID, b.ID) })
	var out []SnapshotRef
	for _, snap := range IDsNamedBy(all, ref) {
		id, _ := s.snaps.least(snap, "")
		out = append(out, SnapshotRef{ID: snap, Sandbox: id})
	}
	return out
}
