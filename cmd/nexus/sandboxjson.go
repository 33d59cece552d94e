package main

import (
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/replay"
)

// jsonSandbox is a sandbox as --json prints it and --format reads it
// (docs/json.md's Sandbox). It is made from the journal's view by
// sandboxJSON alone, so the view (the fold's state, the store's encoding)
// changes without changing what scripts read: a field the view gains is
// printed only once it is added here.
type jsonSandbox struct {
	ID      string        `json:"id"`
	ShortID string        `json:"short_id"`
	Handle  string        `json:"handle,omitempty"`
	Image   string        `json:"image,omitempty"`
	Driver  string        `json:"driver,omitempty"`
	Labels  events.Labels `json:"labels,omitempty"`
	Boot    *jsonBoot     `json:"boot,omitempty"`
	// Root is how the guest's root is made: "overlay" (the shared,
	// read-only image cache entry under an overlay on the workspace disk)
	// or "copy" (a private copy of the OS disk).
	Root       string            `json:"root"`
	Parent     string            `json:"parent,omitempty"`
	Snapshot   string            `json:"snapshot,omitempty"`
	State      projections.State `json:"state"`
	Saga       string            `json:"saga,omitempty"`
	CreatedAt  time.Time         `json:"created_at"`
	UpdatedAt  time.Time         `json:"updated_at"`
	VMM        *jsonProcess      `json:"vmm,omitempty"`
	Supervisor *jsonProcess      `json:"supervisor,omitempty"`
	Volumes    []jsonAttachment  `json:"volumes"`
	Conditions []jsonCondition   `json:"conditions"`
	Snapshots  []string          `json:"snapshots"`
	Resources  []events.Resource `json:"resources"`
	LastRun    string            `json:"last_run,omitempty"`
	FlushedRun string            `json:"flushed_run,omitempty"`
	Seq        uint64            `json:"seq"`
	Rev        uint64            `json:"rev"`
	// Ready, and when it is not, why (Booting, AgentNotReady, VMMExited,
	// NotRunning, ...): projections.Sandbox.Readiness.
	Ready       bool       `json:"ready"`
	ReadyReason string     `json:"ready_reason,omitempty"`
	BootAt      *time.Time `json:"boot_at,omitempty"`
	ReadyAt     *time.Time `json:"ready_at,omitempty"`
}

// jsonBoot is how a sandbox boots besides its driver, as its record keeps
// it (docs/json.md's Boot).
type jsonBoot struct {
	Kernel      string `json:"kernel,omitempty"`
	Initramfs   string `json:"initramfs,omitempty"`
	Cmdline     string `json:"cmdline,omitempty"`
	Cpus        int    `json:"cpus"`
	MemoryBytes int64  `json:"memory_bytes"`
}

// bootJSON is nil for a sandbox whose record predates boot configurations.
func bootJSON(b events.BootConfig) *jsonBoot {
	if b.IsZero() {
		return nil
	}
	return &jsonBoot{Kernel: b.Kernel, Initramfs: b.Initramfs, Cmdline: b.Cmdline, Cpus: b.Cpus, MemoryBytes: b.MemoryBytes}
}

// jsonProcess is a recorded host process (docs/json.md's Process).
type jsonProcess struct {
	Pid        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
	Exited     bool   `json:"exited,omitempty"`
}

// jsonAttachment is a named volume attached to a sandbox (docs/json.md's
// Attachment).
type jsonAttachment struct {
	Name      string `json:"name"`
	GuestPath string `json:"guest_path"`
	ReadOnly  bool   `json:"read_only,omitempty"`
}

// jsonCondition is a status condition (docs/json.md's Condition).
type jsonCondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// sandboxJSON is the one place a sandbox of the journal's view becomes
// what --json and --format show.
func sandboxJSON(sb projections.Sandbox) jsonSandbox {
	out := jsonSandbox{
		ID: sb.ID, ShortID: projections.ShortID(sb.ID), Handle: sb.Handle, Image: sb.Image, Driver: sb.Driver, Boot: bootJSON(sb.BootConfig), Root: sb.BootConfig.RootMode(), Parent: sb.Parent, Snapshot: sb.Snapshot,
		State: sb.State, Saga: sb.Saga, CreatedAt: sb.CreatedAt, UpdatedAt: sb.UpdatedAt,
		VMM: processJSON(sb.VMM), Supervisor: processJSON(sb.Supervisor),
		Snapshots: sb.Snapshots, Resources: sb.Resources,
		LastRun: sb.LastRun, FlushedRun: sb.FlushedRun, Seq: sb.Seq, Rev: sb.Rev,
	}
	out.Labels = sb.Labels
	out.Ready, out.ReadyReason = sb.Readiness()
	out.BootAt, out.ReadyAt = timeOrNil(sb.BootAt), timeOrNil(sb.ReadyAt)
	for _, v := range sb.Volumes {
		out.Volumes = append(out.Volumes, jsonAttachment{Name: v.Name, GuestPath: v.GuestPath, ReadOnly: v.ReadOnly})
	}
	for _, c := range sb.Conditions {
		out.Conditions = append(out.Conditions, jsonCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
	}
	return out
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func processJSON(p *projections.Process) *jsonProcess {
	if p == nil {
		return nil
	}
	return &jsonProcess{Pid: p.Pid, StartTicks: p.StartTicks, Exited: p.Exited}
}

// sandboxesJSON is sandboxJSON of each.
func sandboxesJSON(list []projections.Sandbox) []jsonSandbox {
	out := make([]jsonSandbox, len(list))
	for i, sb := range list {
		out[i] = sandboxJSON(sb)
	}
	return out
}

// jsonReplayState is replay.State as `replay at` prints it (docs/json.md's
// ReplayState), its sandboxes as every other command shows them.
type jsonReplayState struct {
	Seq       uint64                  `json:"seq"`
	Time      time.Time               `json:"time"`
	Sandboxes []jsonSandbox           `json:"sandboxes"`
	Ownership []projections.OwnedPath `json:"ownership"`
	Volumes   []*projections.Volume   `json:"volumes"`
	OpenSagas []*projections.OpenSaga `json:"open_sagas"`
}

func replayStateJSON(st replay.State) jsonReplayState {
	out := jsonReplayState{Seq: st.Seq, Time: st.Time, Ownership: st.Ownership, Volumes: st.Volumes, OpenSagas: st.OpenSagas}
	for _, sb := range st.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, sandboxJSON(*sb))
	}
	return out
}
