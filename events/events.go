// Package events defines every lifecycle fact nexus records in its journal,
// and their versioned msgpack encoding. It is pure: no I/O, no clock, no
// randomness; callers supply ids and times.
package events

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// Type names a kind of event. It is always "<category>.<action>", two NATS
// subject tokens, so subscribers can filter by either.
type Type string

// Every event type nexus writes. The set is closed: decoding any other type
// is an error (ErrUnknownType), never a silent default.
const (
	SandboxCreated  Type = "sandbox.created"
	SandboxForked   Type = "sandbox.forked"
	SandboxRestored Type = "sandbox.restored"
	SandboxStarted  Type = "sandbox.started"
	SandboxReady    Type = "sandbox.ready"
	SandboxNotReady Type = "sandbox.not_ready"
	SandboxStopped  Type = "sandbox.stopped"
	SandboxFailed   Type = "sandbox.failed"
	SandboxRemoved  Type = "sandbox.removed"
	SandboxRenamed  Type = "sandbox.renamed"

	DiskMaterialised Type = "disk.materialised"
	IntentWritten    Type = "intent.written"
	IntentRetired    Type = "intent.retired"

	SupervisorStarted Type = "supervisor.started"
	SupervisorStopped Type = "supervisor.stopped"
	SupervisorExited  Type = "supervisor.exited"

	VMMExited Type = "vmm.exited"

	SnapshotTaken Type = "snapshot.taken"

	HandleClaimed Type = "handle.claimed"

	VolumeCreated  Type = "volume.created"
	VolumeAttached Type = "volume.attached"
	VolumeDetached Type = "volume.detached"
	VolumeRemoved  Type = "volume.removed"

	FlushPending      Type = "flush.pending"
	FlushAcknowledged Type = "flush.acknowledged"
	FlushRestored     Type = "flush.restored"
	OverlayRecovered  Type = "overlay.recovered"
	WarningRaised     Type = "warning.raised"

	ResourceCreated   Type = "resource.created"
	ReapDecided       Type = "reap.decided"
	ReapApplied       Type = "reap.applied"
	ResourceReclaimed Type = "resource.reclaimed"

	RunSwept Type = "run.swept"
	RunKept  Type = "run.kept"

	ImageCachePrepared Type = "imagecache.prepared"
	ImageCacheUsed     Type = "imagecache.used"
	ImageCachePruned   Type = "imagecache.pruned"

	MirrorCreated        Type = "mirror.created"
	MirrorRecreated      Type = "mirror.recreated"
	MirrorLinked         Type = "mirror.linked"
	MirrorUnlinked       Type = "mirror.unlinked"
	MirrorSettingsDiffer Type = "mirror.settings_differ"
	MirrorRefused        Type = "mirror.refused"

	JournalDigest Type = "journal.digest"

	SagaStarted     Type = "saga.started"
	SagaFinished    Type = "saga.finished"
	SagaCompensated Type = "saga.compensated"
)

// SubjectPrefix is the first two tokens of every journal subject.
const SubjectPrefix = "nexus.events"

// NoSandbox is the subject token used for events that belong to no sandbox
// (runs, reap plans), so every subject has the same token count.
const NoSandbox = "_"

// Envelope is what every event carries besides its payload.
type Envelope struct {
	ID      ulid.ULID // unique event id; also the journal's de-duplication id unless MsgID overrides it
	Type    Type
	Schema  uint16    // payload schema version
	Sandbox string    // owning sandbox ULID, or "" for none
	Time    time.Time // when the fact took effect, as the caller saw it
	Saga    string    // saga id, or ""
	Step    string    // saga step name, or ""
}

// Payload is the typed body of an event.
type Payload interface {
	EventType() Type
}

// Event is one decoded lifecycle fact.
type Event struct {
	Envelope
	Payload Payload
}

// New builds an event around p, stamping the envelope's type and current
// schema version from the payload so the two can never disagree. A
// handle.claimed event belongs to its handle, not to a sandbox: its
// envelope names none (its payload does), so it is no event of the
// sandbox's and is stored on the handle's own subject.
func New(id ulid.ULID, at time.Time, sandbox string, p Payload) Event {
	t := p.EventType()
	if t == HandleClaimed {
		sandbox = ""
	}
	return Event{
		Envelope: Envelope{ID: id, Type: t, Schema: registry[t].current, Sandbox: sandbox, Time: at.UTC()},
		Payload:  p,
	}
}

// InSaga returns a copy of e attributed to a saga step.
func (e Event) InSaga(saga, step string) Event {
	e.Saga, e.Step = saga, step
	return e
}

// Subject is where e is published: nexus.events.<category>.<action>.<sandbox>,
// for a handle.claimed event the handle's subject (HandleSubject), and for
// a volume.created or volume.removed its volume's (VolumeSubject).
func (e Event) Subject() (string, error) {
	if p, ok := e.Payload.(HandleClaimedEvent); ok {
		if p.Handle == "" {
			return "", fmt.Errorf("%s names no handle", e.Type)
		}
		return HandleSubject(p.Handle), nil
	}
	if name, ok := VolumeOf(e); ok {
		if name == "" {
			return "", fmt.Errorf("%s names no volume", e.Type)
		}
		return VolumeSubject(e.Type, name), nil
	}
	return Subject(e.Type, e.Sandbox)
}

// VolumeOf is the volume whose own subject e is published on: the volume
// a volume.created or volume.removed names. A volume.attached or
// .detached belongs to its sandbox and stays on the sandbox's subject.
func VolumeOf(e Event) (string, bool) {
	switch p := e.Payload.(type) {
	case VolumeCreatedEvent:
		return p.Name, true
	case VolumeRemovedEvent:
		return p.Name, true
	}
	return "", false
}

// VolumeSubject is where a volume's own event of type t is published:
// nexus.events.<category>.<action>.<VolumeToken(name)>.
func VolumeSubject(t Type, name string) string {
	return SubjectPrefix + "." + string(t) + "." + VolumeToken(name)
}

// VolumeSubjects is the subject filter matching every event on a volume's
// own subject. The journal's last record on it is what a decision about
// the volume expects, there.
func VolumeSubjects(name string) string {
	return SubjectPrefix + ".volume.*." + VolumeToken(name)
}

// HandleSubject is the subject of every claim of handle:
// nexus.events.handle.claimed.<HandleToken(handle)>. The journal's last
// record on it is the claim a new claim of the handle must expect.
func HandleSubject(handle string) string {
	return SubjectPrefix + "." + string(HandleClaimed) + "." + HandleToken(handle)
}

// HandleToken encodes handle as one subject token: "h_", then the handle
// with every byte other than a letter, a digit or '-' written as '_' and
// two hex digits ("web/1" is h_web_2F1). The encoding is injective, uses no
// character a subject gives a meaning to, and holds a '_', which neither a
// sandbox ULID nor NoSandbox alone does, so a handle's subject never
// matches a sandbox's filter.
func HandleToken(handle string) string { return subjectToken("h_", handle) }

// VolumeToken encodes a volume name as one subject token the way
// HandleToken encodes a handle, behind "v_" ("my_vol" is v_my_5Fvol): no
// sandbox's, no handle's and not NoSandbox.
func VolumeToken(name string) string { return subjectToken("v_", name) }

func subjectToken(prefix, s string) string {
	const hex = "0123456789ABCDEF"
	b := []byte(prefix)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b = append(b, c)
			continue
		}
		b = append(b, '_', hex[c>>4], hex[c&15])
	}
	return string(b)
}

// HandleOf is the handle e gives its sandbox: the handle of a
// sandbox.created, sandbox.forked or sandbox.restored that names one, or
// the new handle of a sandbox.renamed, or "". Such an event is appended
// with the handle.claimed of the same handle right after it, in one batch.
func HandleOf(e Event) string {
	switch p := e.Payload.(type) {
	case SandboxCreatedEvent:
		return p.Handle
	case SandboxForkedEvent:
		return p.Handle
	case SandboxRestoredEvent:
		return p.Handle
	case SandboxRenamedEvent:
		return p.Handle
	}
	return ""
}

// Subject builds the journal subject for an event type and sandbox. An
// event's own subject is Event.Subject: a handle's claims and a volume's
// own events are on their entity's token instead.
func Subject(t Type, sandbox string) (string, error) {
	if _, ok := registry[t]; !ok {
		return "", fmt.Errorf("%w: %q", ErrUnknownType, t)
	}
	token := NoSandbox
	if sandbox != "" {
		if _, err := ulid.ParseStrict(sandbox); err != nil {
			return "", fmt.Errorf("sandbox %q is not a ULID: %w", sandbox, err)
		}
		token = sandbox
	}
	return SubjectPrefix + "." + string(t) + "." + token, nil
}

// SandboxSubjects is the subject filter matching every event of one sandbox.
func SandboxSubjects(sandbox string) string {
	return SubjectPrefix + ".*.*." + sandbox
}

// FilterSubject is the subject filter selecting events of a type (a full
// type such as "reap.decided", a category such as "reap", or "" for all) and
// of one sandbox ("" for all).
func FilterSubject(t string, sandbox string) (string, error) {
	category, action := "*", "*"
	if t != "" {
		parts := strings.Split(t, ".")
		switch {
		case len(parts) == 1 && categories[parts[0]]:
			category = parts[0]
		case len(parts) == 2 && registry[Type(t)].current != 0:
			category, action = parts[0], parts[1]
		default:
			return "", fmt.Errorf("%w: %q", ErrUnknownType, t)
		}
	}
	token := "*"
	if sandbox != "" {
		if _, err := ulid.ParseStrict(sandbox); err != nil {
			return "", fmt.Errorf("sandbox %q is not a ULID: %w", sandbox, err)
		}
		token = sandbox
	}
	return SubjectPrefix + "." + category + "." + action + "." + token, nil
}

// notable are the facts a person acting on sandboxes asked for or must
// know about. The other types (intents, resources, flushes, finished
// sagas, image-cache use, mirror links) are the bookkeeping that makes
// those facts safe to act on after a crash.
var notable = []Type{
	SandboxCreated, SandboxForked, SandboxRestored, SandboxStarted, SandboxReady, SandboxNotReady, SandboxStopped, SandboxFailed, SandboxRemoved,
	SandboxRenamed, VMMExited, SnapshotTaken, VolumeCreated, VolumeAttached, VolumeDetached, VolumeRemoved,
	OverlayRecovered, WarningRaised, ReapApplied, ImageCachePruned, SagaCompensated,
}

// Notable lists the notable types, for a query's Types.
func Notable() []string {
	out := make([]string, len(notable))
	for i, t := range notable {
		out[i] = string(t)
	}
	return out
}

// FilterSubjects is the set of subject filters selecting events of any of
// types (full types or categories; none selects all) and of one sandbox
// ("" for all); nil means every event, so a reader needs no filter at all.
// A type its category already covers is dropped, because JetStream refuses
// overlapping filters on one consumer.
func FilterSubjects(types []string, sandbox string) ([]string, error) {
	if len(types) == 0 {
		types = []string{""}
	}
	if sandbox == "" && slices.Contains(types, "") {
		for _, t := range types { // still refuse an unknown type
			if _, err := FilterSubject(t, ""); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	cats := map[string]bool{}
	for _, t := range types {
		if t == "" {
			cats[""] = true
		} else if !strings.Contains(t, ".") {
			cats[t] = true
		}
	}
	var out []string
	seen := map[string]bool{}
	for _, t := range types {
		f, err := FilterSubject(t, sandbox)
		if err != nil {
			return nil, err
		}
		cat, _, full := strings.Cut(t, ".")
		if seen[f] || cats[""] && t != "" || full && cats[cat] {
			continue
		}
		seen[f] = true
		out = append(out, f)
	}
	return out, nil
}

// Types lists every known event type, for help text and tests.
func Types() []Type {
	out := make([]Type, 0, len(registry))
	for t := range registry {
		out = append(out, t)
	}
	return out
}

var categories = func() map[string]bool {
	m := map[string]bool{}
	for t := range registry {
		m[strings.SplitN(string(t), ".", 2)[0]] = true
	}
	return m
}()

// DedupID is the journal message id of e. A saga step's id is derived from
// the saga and step alone, so a step retried after a crash, even with a new
// event id, is recognised as the same append.
func (e Event) DedupID() string {
	if e.Saga != "" && e.Step != "" {
		return "saga." + e.Saga + "." + e.Step
	}
	return e.ID.String()
}
