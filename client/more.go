package client

import (
	"cmp"
	"context"
	"errors"
	"io"
	"maps"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/projections"
)

// RestoreSpec is a new sandbox made from a snapshot.
type RestoreSpec struct {
	Snapshot string // its ID, or a unique prefix of it
	Handle   string
	Labels   map[string]string
	Ready    ReadyWait
}

// Restore makes a new running sandbox from a snapshot, bound to this run
// as a fork's children are: listed once the restore returns it.
func (c *Client) Restore(ctx context.Context, spec RestoreSpec) (Sandbox, error) {
	c.mu.Lock()
	err := c.beginLocked(ctx)
	c.mu.Unlock()
	if err != nil {
		return Sandbox{}, wrap("restore", spec.Snapshot, err)
	}
	var sb projections.Sandbox
	err = c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		if sb, err = m.Restore(ctx, spec.Snapshot, lifecycle.RestoreOptions{Handle: spec.Handle, Labels: events.Labels(spec.Labels)}); err != nil {
			return err
		}
		err = c.bind(sb.ID)
		var werr error
		sb, werr = awaitReady(ctx, m, sb, spec.Ready)
		return errors.Join(err, werr)
	})
	if sb.ID == "" {
		return Sandbox{}, wrap("restore", spec.Snapshot, err)
	}
	return sandboxOf(sb), wrap("restore", spec.Snapshot, err)
}

// Rename gives a sandbox a new handle; its old one is free once it
// returns. A handle another sandbox holds is refused (ErrHandleTaken).
func (c *Client) Rename(ctx context.Context, ref, handle string) (Sandbox, error) {
	var sb projections.Sandbox
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		sb, err = m.Rename(ctx, ref, handle)
		return err
	})
	return already("rename", ref, sb, err)
}

// LogOptions selects one of a sandbox's logs: "console" (the guest's
// console; the default), "vmm" or "supervisor"; Tail starts at its last
// lines; Follow keeps copying what is appended until ctx ends. Since
// starts at the first line seen at or after it, Timestamps prefixes each
// line with when it was seen (to about a second): the console log only,
// as `nexus logs` says.
type LogOptions struct {
	Kind       string
	Tail       int
	Follow     bool
	Since      time.Time
	Timestamps bool
}

// Logs copies a sandbox's log to w.
func (c *Client) Logs(ctx context.Context, ref string, o LogOptions, w io.Writer) error {
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		return m.Logs(ctx, ref, lifecycle.LogOptions{Kind: cmp.Or(o.Kind, "console"), Tail: o.Tail, Follow: o.Follow, Since: o.Since, Timestamps: o.Timestamps}, w)
	})
	return wrap("logs", ref, err)
}

// Volume is a named ext4 disk: never reaped, attached to sandboxes at
// create, removed only by RemoveVolume.
type Volume struct {
	Name       string            `json:"name"`
	Path       string            `json:"path"`
	SizeBytes  int64             `json:"size_bytes"`
	AttachedTo []string          `json:"attached_to"`
	Labels     map[string]string `json:"labels,omitempty"`
}

func volumeOf(v projections.Volume) Volume {
	return Volume{Name: v.Name, Path: v.Path, SizeBytes: v.SizeBytes, AttachedTo: append([]string{}, v.AttachedTo...), Labels: maps.Clone(v.Labels)}
}

// CreateVolume makes a named volume of size bytes.
func (c *Client) CreateVolume(ctx context.Context, name string, size int64, labels map[string]string) (Volume, error) {
	var v projections.Volume
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		v, err = m.VolumeCreate(ctx, name, size, events.Labels(labels))
		return err
	})
	if err != nil {
		return Volume{}, wrap("volume create", name, err)
	}
	return volumeOf(v), nil
}

// Volumes lists every named volume.
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	var list []projections.Volume
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		list, err = m.Volumes(ctx)
		return err
	})
	if err != nil {
		return nil, wrap("volume ls", "", err)
	}
	out := make([]Volume, len(list))
	for i, v := range list {
		out[i] = volumeOf(v)
	}
	return out, nil
}

// RemoveVolume deletes a named volume and its data. One attached to a
// sandbox is refused.
func (c *Client) RemoveVolume(ctx context.Context, name string) error {
	err := c.manage(ctx, func(m *lifecycle.Manager) error { return m.VolumeRemove(ctx, name) })
	return wrap("volume rm", name, err)
}

// CopyIn writes what r yields to the absolute path in a sandbox's guest,
// through its agent; the agent publishes the file only once every byte is
// durable on the guest's disk. It returns the bytes written.
func (c *Client) CopyIn(ctx context.Context, ref, path string, r io.Reader) (int64, error) {
	return c.copyIn(ctx, ref, "-", path, r)
}

// CopyFileIn copies the local regular file to path in the guest with the
// file's permission bits (`nexus cp LOCAL ID:PATH`); a path ending in "/"
// receives it under its local name.
func (c *Client) CopyFileIn(ctx context.Context, ref, local, path string) (int64, error) {
	return c.copyIn(ctx, ref, local, path, nil)
}

func (c *Client) copyIn(ctx context.Context, ref, local, path string, r io.Reader) (int64, error) {
	var n int64
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		n, err = m.CopyIn(ctx, ref, local, path, r)
		return err
	})
	return n, wrap("cp", ref, err)
}

// CopyOut writes the guest file at the absolute path to w and returns the
// bytes written.
func (c *Client) CopyOut(ctx context.Context, ref, path string, w io.Writer) (int64, error) {
	return c.copyOut(ctx, ref, path, "-", w)
}

// CopyFileOut copies the guest file at path to the local file, published as
// nexus publishes its own (written to a temporary name, fsynced, renamed
// into place: `nexus cp ID:PATH LOCAL`); a local directory receives it
// under its guest name.
func (c *Client) CopyFileOut(ctx context.Context, ref, path, local string) (int64, error) {
	return c.copyOut(ctx, ref, path, local, nil)
}

func (c *Client) copyOut(ctx context.Context, ref, path, local string, w io.Writer) (int64, error) {
	var n int64
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		n, err = m.CopyOut(ctx, ref, path, local, w)
		return err
	})
	return n, wrap("cp", ref, err)
}

// SnapshotInfo is one snapshot: its ID, the sandbox it was taken of, when,
// and what its files hold on disk now.
type SnapshotInfo struct {
	ID             string            `json:"id"`
	Sandbox        string            `json:"sandbox"`
	Handle         string            `json:"handle,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	AllocatedBytes int64             `json:"allocated_bytes"`
}

// Snapshots lists the snapshots of the sandbox ref names, or of every
// sandbox for "" (`nexus snapshot ls`).
func (c *Client) Snapshots(ctx context.Context, ref string) ([]SnapshotInfo, error) {
	var out []SnapshotInfo
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		list, err := m.Snapshots(ctx, ref)
		for _, s := range list {
			out = append(out, SnapshotInfo{ID: s.ID, Sandbox: s.Sandbox, Handle: s.Handle, Labels: maps.Clone(s.Labels),
				CreatedAt: s.CreatedAt, AllocatedBytes: s.AllocatedBytes})
		}
		return err
	})
	return out, wrap("snapshot ls", ref, err)
}

// RemoveSnapshot deletes one snapshot (its ID or a unique prefix of it);
// ErrNotFound when there is none (`nexus snapshot rm --yes`).
func (c *Client) RemoveSnapshot(ctx context.Context, snap string) error {
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		_, err := m.SnapshotRemove(ctx, snap)
		return err
	})
	return wrap("snapshot rm", snap, err)
}

// The conditions Wait waits for.
const (
	ForReady   = lifecycle.ForReady   // the guest is Ready
	ForStopped = lifecycle.ForStopped // no VMM runs (stopped, exited or in error)
	ForExited  = lifecycle.ForExited  // the VMM ended without a stop
)

// Wait waits up to timeout (0: the default Ready timeout) for a sandbox to
// reach cond (ForReady, ForStopped or ForExited), as `nexus wait --for`.
func (c *Client) Wait(ctx context.Context, ref, cond string, timeout time.Duration) (Sandbox, error) {
	var sb projections.Sandbox
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		sb, err = m.WaitFor(ctx, ref, cond, timeout)
		return err
	})
	if sb.ID == "" {
		return Sandbox{}, wrap("wait", ref, err)
	}
	return sandboxOf(sb), wrap("wait", ref, err)
}
