package projections

import (
	"encoding/json"
	"time"

	"github.com/nexus-sandbox/nexus/events"
)

// SandboxJSON is a sandbox as --json prints it and --format reads it
// (docs/json.md's Sandbox). It is made from the journal's view by
// sandboxJSON alone, so the view (the fold's state, the store's encoding)
// changes without changing what scripts read: a field the view gains is
// printed only once it is added here.
type SandboxJSON struct {
	ID      string        `json:"id"`
	ShortID string        `json:"short_id"`
	Handle  string        `json:"handle,omitempty"`
	Image   string        `json:"image,omitempty"`
	Driver  string        `json:"driver,omitempty"`
	Labels  events.Labels `json:"labels,omitempty"`
	Boot    *BootJSON     `json:"boot,omitempty"`
	// Root is how the guest's root is made: "overlay" (the shared,
	// read-only image cache entry under an overlay on the workspace disk)
	// or "copy" (a private copy of the OS disk).
	Root       string            `json:"root"`
	Parent     string            `json:"parent,omitempty"`
	Snapshot   string            `json:"snapshot,omitempty"`
	State      State             `json:"state"`
	Saga       string            `json:"saga,omitempty"`
	CreatedAt  time.Time         `json:"created_at"`
	UpdatedAt  time.Time         `json:"updated_at"`
	VMM        *ProcessJSON      `json:"vmm,omitempty"`
	Supervisor *ProcessJSON      `json:"supervisor,omitempty"`
	Volumes    []AttachmentJSON  `json:"volumes"`
	Conditions []ConditionJSON   `json:"conditions"`
	Snapshots  []string          `json:"snapshots"`
	Resources  []events.Resource `json:"resources"`
	LastRun    string            `json:"last_run,omitempty"`
	FlushedRun string            `json:"flushed_run,omitempty"`
	Seq        uint64            `json:"seq"`
	Rev        uint64            `json:"rev"`
	// Ready, and when it is not, why (Booting, AgentNotReady, VMMExited,
	// NotRunning, ...): Sandbox.Readiness.
	Ready       bool       `json:"ready"`
	ReadyReason string     `json:"ready_reason,omitempty"`
	BootAt      *time.Time `json:"boot_at,omitempty"`
	ReadyAt     *time.Time `json:"ready_at,omitempty"`
}

// BootJSON is how a sandbox boots besides its driver, as its record keeps
// it (docs/json.md's Boot).
type BootJSON struct {
	Kernel      string `json:"kernel,omitempty"`
	Initramfs   string `json:"initramfs,omitempty"`
	Cmdline     string `json:"cmdline,omitempty"`
	Cpus        int    `json:"cpus"`
	MemoryBytes int64  `json:"memory_bytes"`
}

// bootJSON is nil for a sandbox whose record predates boot configurations.
func bootJSON(b events.BootConfig) *BootJSON {
	if b.IsZero() {
		return nil
	}
	return &BootJSON{Kernel: b.Kernel, Initramfs: b.Initramfs, Cmdline: b.Cmdline, Cpus: b.Cpus, MemoryBytes: b.MemoryBytes}
}

// ProcessJSON is a recorded host process (docs/json.md's Process).
type ProcessJSON struct {
	Pid        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
	Exited     bool   `json:"exited,omitempty"`
}

// AttachmentJSON is a named volume attached to a sandbox (docs/json.md's
// Attachment).
type AttachmentJSON struct {
	Name      string `json:"name"`
	GuestPath string `json:"guest_path"`
	ReadOnly  bool   `json:"read_only,omitempty"`
}

// ConditionJSON is a status condition (docs/json.md's Condition).
type ConditionJSON struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// SandboxDocument is the one place a sandbox of the journal's view becomes
// what --json and --format show: times in UTC and every list a list ([],
// never null), so it prints as it is (ListItem).
func SandboxDocument(sb Sandbox) SandboxJSON {
	out := SandboxJSON{
		ID: sb.ID, ShortID: ShortID(sb.ID), Handle: sb.Handle, Image: sb.Image, Driver: sb.Driver, Boot: bootJSON(sb.BootConfig), Root: sb.BootConfig.RootMode(), Parent: sb.Parent, Snapshot: sb.Snapshot,
		State: sb.State, Saga: sb.Saga, CreatedAt: sb.CreatedAt.UTC(), UpdatedAt: sb.UpdatedAt.UTC(),
		VMM: processJSON(sb.VMM), Supervisor: processJSON(sb.Supervisor),
		Snapshots: orEmpty(sb.Snapshots), Resources: orEmpty(sb.Resources),
		Volumes: []AttachmentJSON{}, Conditions: []ConditionJSON{},
		LastRun: sb.LastRun, FlushedRun: sb.FlushedRun, Seq: sb.Seq, Rev: sb.Rev,
	}
	out.Labels = sb.Labels
	out.Ready, out.ReadyReason = sb.Readiness()
	out.BootAt, out.ReadyAt = timeOrNil(sb.BootAt), timeOrNil(sb.ReadyAt)
	for _, v := range sb.Volumes {
		out.Volumes = append(out.Volumes, AttachmentJSON{Name: v.Name, GuestPath: v.GuestPath, ReadOnly: v.ReadOnly})
	}
	for _, c := range sb.Conditions {
		out.Conditions = append(out.Conditions, ConditionJSON{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
	}
	return out
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func processJSON(p *Process) *ProcessJSON {
	if p == nil {
		return nil
	}
	return &ProcessJSON{Pid: p.Pid, StartTicks: p.StartTicks, Exited: p.Exited}
}

// ListItem is sb's SandboxDocument as a listing prints it, one item of an
// indented JSON array: the store keeps these bytes for each stopped
// sandbox, so listing every sandbox copies them.
func ListItem(sb Sandbox) ([]byte, error) {
	return json.MarshalIndent(SandboxDocument(sb), listPrefix, listIndent)
}

// The indentation of a listing's items: each item is indented once inside
// the array.
const (
	listPrefix = "  "
	listIndent = "  "
)

// ListWriter writes a JSON array of items that ListItem made, as they
// come, in the layout of an indented array ("[]" when empty).
type ListWriter struct {
	w interface{ Write([]byte) (int, error) }
	n int
}

// NewListWriter starts a list on w; Close ends it.
func NewListWriter(w interface{ Write([]byte) (int, error) }) *ListWriter {
	return &ListWriter{w: w}
}

// Item writes one item (ListItem's bytes).
func (l *ListWriter) Item(item []byte) error {
	sep := ",\n" + listPrefix
	if l.n == 0 {
		sep = "[\n" + listPrefix
	}
	l.n++
	if _, err := l.w.Write([]byte(sep)); err != nil {
		return err
	}
	_, err := l.w.Write(item)
	return err
}

// Close ends the list.
func (l *ListWriter) Close() error {
	end := "\n]\n"
	if l.n == 0 {
		end = "[]\n"
	}
	_, err := l.w.Write([]byte(end))
	return err
}
