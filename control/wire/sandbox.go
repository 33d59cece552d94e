package wire

import (
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// Sandbox is one sandbox as the daemon's answers carry it: the journal's
// view (projections.Sandbox) whole, Bootstrap included, so a sandbox read
// through the daemon is the sandbox a store in process reads. SandboxOf
// and View are the one conversion each way.
type Sandbox struct {
	ID         string            `json:"id"`
	Handle     string            `json:"handle,omitempty"`
	Image      string            `json:"image,omitempty"`
	Driver     string            `json:"driver,omitempty"`
	Parent     string            `json:"parent,omitempty"`
	Snapshot   string            `json:"snapshot,omitempty"`
	State      projections.State `json:"state"`
	Saga       string            `json:"saga,omitempty"`
	CreatedAt  time.Time         `json:"created_at"`
	UpdatedAt  time.Time         `json:"updated_at"`
	VMM        *Process          `json:"vmm,omitempty"`
	Supervisor *Process          `json:"supervisor,omitempty"`
	Volumes    []Attachment      `json:"volumes"`
	Conditions []Condition       `json:"conditions"`
	Snapshots  []string          `json:"snapshots"`
	Resources  []events.Resource `json:"resources"`
	Bootstrap  events.Bootstrap  `json:"bootstrap,omitzero"`
	BootConfig events.BootConfig `json:"boot,omitzero"`
	LastRun    string            `json:"last_run,omitempty"`
	FlushedRun string            `json:"flushed_run,omitempty"`
	Seq        uint64            `json:"seq"`
	Rev        uint64            `json:"rev"`
	BootAt     time.Time         `json:"boot_at,omitzero"`
	ReadyAt    time.Time         `json:"ready_at,omitzero"`
	Labels     events.Labels     `json:"labels,omitempty"`
}

// Process, Attachment and Condition cross the wire in their --json form.
type (
	Process    = projections.ProcessJSON
	Attachment = projections.AttachmentJSON
	Condition  = projections.ConditionJSON
)

// SandboxOf is sb as the daemon sends it.
func SandboxOf(sb projections.Sandbox) Sandbox {
	out := Sandbox{
		ID: sb.ID, Handle: sb.Handle, Image: sb.Image, Driver: sb.Driver, Parent: sb.Parent, Snapshot: sb.Snapshot,
		State: sb.State, Saga: sb.Saga, CreatedAt: sb.CreatedAt, UpdatedAt: sb.UpdatedAt,
		Snapshots: sb.Snapshots, Resources: sb.Resources, Bootstrap: sb.Bootstrap, BootConfig: sb.BootConfig,
		LastRun: sb.LastRun, FlushedRun: sb.FlushedRun, Seq: sb.Seq, Rev: sb.Rev, Labels: sb.Labels,
	}
	if p := sb.VMM; p != nil {
		out.VMM = &Process{Pid: p.Pid, StartTicks: p.StartTicks, Exited: p.Exited}
	}
	if p := sb.Supervisor; p != nil {
		out.Supervisor = &Process{Pid: p.Pid, StartTicks: p.StartTicks, Exited: p.Exited}
	}
	out.BootAt, out.ReadyAt = sb.BootAt, sb.ReadyAt
	out.Volumes = each(sb.Volumes, func(v projections.Attachment) Attachment {
		return Attachment{Name: v.Name, GuestPath: v.GuestPath, ReadOnly: v.ReadOnly}
	})
	out.Conditions = each(sb.Conditions, func(c projections.Condition) Condition {
		return Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}
	})
	return out
}

// View is the journal's view of the sandbox s carries.
func (s Sandbox) View() projections.Sandbox {
	sb := projections.Sandbox{
		ID: s.ID, Handle: s.Handle, Image: s.Image, Driver: s.Driver, Parent: s.Parent, Snapshot: s.Snapshot,
		State: s.State, Saga: s.Saga, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt,
		Snapshots: s.Snapshots, Resources: s.Resources, Bootstrap: s.Bootstrap, BootConfig: s.BootConfig,
		LastRun: s.LastRun, FlushedRun: s.FlushedRun, Seq: s.Seq, Rev: s.Rev, Labels: s.Labels,
	}
	if p := s.VMM; p != nil {
		sb.VMM = &projections.Process{Pid: p.Pid, StartTicks: p.StartTicks, Exited: p.Exited}
	}
	if p := s.Supervisor; p != nil {
		sb.Supervisor = &projections.Process{Pid: p.Pid, StartTicks: p.StartTicks, Exited: p.Exited}
	}
	sb.BootAt, sb.ReadyAt = s.BootAt, s.ReadyAt
	sb.Volumes = each(s.Volumes, func(v Attachment) projections.Attachment {
		return projections.Attachment{Name: v.Name, GuestPath: v.GuestPath, ReadOnly: v.ReadOnly}
	})
	sb.Conditions = each(s.Conditions, func(c Condition) projections.Condition {
		return projections.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}
	})
	return sb
}

// SandboxesOf is SandboxOf of each: the daemon's list answers.
func SandboxesOf(list []projections.Sandbox) []Sandbox { return each(list, SandboxOf) }

// Views is View of each: a list answer as the client returns it.
func Views(list []Sandbox) []projections.Sandbox { return each(list, Sandbox.View) }

// each is f of every item of in; a nil list stays nil and an empty one
// empty, so a sandbox's lists cross the wire as they were.
func each[S, T any](in []S, f func(S) T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}
