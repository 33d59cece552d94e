package core

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// Command is an operation on one existing sandbox.
type Command string

const (
	Start  Command = "start"
	Stop   Command = "stop"
	Remove Command = "rm" // refused while a VMM runs (rm -f stops it first)
	// ForceRemove is `rm -f`: the removal stops whatever still runs.
	ForceRemove Command = "rm -f"
	// SnapshotRemove deletes one of the sandbox's snapshots.
	SnapshotRemove Command = "snapshot rm"
	Snapshot       Command = "snapshot"
	Fork           Command = "fork"
	Restore        Command = "restore" // restoring a snapshot of this sandbox
	Rename         Command = "rename"  // giving it another handle
)

// ErrRefused marks a command the sandbox's state does not allow.
var ErrRefused = errors.New("refused")

// Refusal is a command the state does not allow, and why.
type Refusal struct {
	Command Command
	Entity  Entity
	Reason  string
	// Saga is the open saga that blocks the command, if one does.
	Saga *projections.OpenSaga
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("%s of %s: %s", r.Command, r.Entity.Name(), r.Reason)
}

func (r *Refusal) Unwrap() error { return ErrRefused }

// ErrAlready marks a command whose end state already holds: stop of a
// stopped sandbox, start of a running one. Like docker, commands treat it
// as success, so scripts can say what they want rather than check first.
var ErrAlready = errors.New("already")

// Already is a command with nothing to do, and the state that makes it so.
type Already struct {
	Command Command
	Entity  Entity
	State   projections.State
}

func (a *Already) Error() string {
	return fmt.Sprintf("%s is already %s", a.Entity.Name(), a.State)
}

func (a *Already) Unwrap() error { return ErrAlready }

// SagaOn returns a copy of the saga of open that is on sandbox id, or nil.
// A sandbox has at most one: its runner lease admits one at a time.
func SagaOn(open []projections.OpenSaga, id string) *projections.OpenSaga {
	for i := range open {
		if open[i].Sandbox == id {
			sg := open[i]
			return &sg
		}
	}
	return nil
}

// Decide says whether cmd may run on sb, given the sagas the journal shows
// open. It is the one place these rules live: lifecycle calls it once it
// holds the sandbox's runner lease and has read the sandbox afresh, and
// again whenever the journal refuses its first append as stale.
func Decide(cmd Command, sb projections.Sandbox, open []projections.OpenSaga) error {
	refuse := func(format string, a ...any) error {
		return &Refusal{Command: cmd, Entity: Sandbox(sb.ID), Reason: fmt.Sprintf(format, a...)}
	}
	if sg := SagaOn(open, sb.ID); sg != nil {
		return &Refusal{Command: cmd, Entity: Sandbox(sb.ID), Saga: sg,
			Reason: fmt.Sprintf("its %s saga %s was interrupted and is still open (run `nexus recover`)", sg.Kind, sg.ID)}
	}
	if sb.State == projections.StateCreating {
		return refuse("it is still being created (run `nexus recover` if its creator died)")
	}
	switch {
	case cmd == Start && sb.State == projections.StateRunning && sb.VMM != nil && !sb.VMM.Exited,
		cmd == Stop && sb.State == projections.StateStopped:
		return &Already{Command: cmd, Entity: Sandbox(sb.ID), State: sb.State}
	}
	switch cmd {
	case Start:
		// A sandbox a refused start left in error (no VMM) may start again;
		// an exited one is settled first, as after a crash.
		if sb.State == projections.StateStopped || sb.State == projections.StateExited || (sb.State == projections.StateError && sb.VMM == nil) {
			return nil
		}
		return refuse("it is %s, not stopped", sb.State)
	case Stop:
		// Stopping an exited sandbox settles what its dead VMM left.
		if sb.State != projections.StateRunning && sb.State != projections.StateExited {
			return refuse("it is %s, not running", sb.State)
		}
	case Snapshot:
		if sb.State != projections.StateRunning && sb.State != projections.StateStopped {
			return refuse("it is %s", sb.State)
		}
	case Fork:
		if sb.State == projections.StateExited {
			return refuse("its VMM exited (start or stop it first)")
		}
	case Remove:
		if sb.State == projections.StateRunning {
			return refuse("it is running (stop it first, or use `nexus rm -f`)")
		}
	case Rename:
		// Shadow disks and their intent are named by the handle
		// (layout's <safeHandle>.shadow.*): a new handle would leave them
		// named for one the sandbox no longer holds.
		for _, r := range sb.Resources {
			if r.Kind == events.KindShadowDisk || r.Kind == events.KindShadowIntent {
				return refuse("its shadow disk %s is named by its handle %q", r.Path, sb.Handle)
			}
		}
	case ForceRemove, Restore, SnapshotRemove:
	default:
		return refuse("unknown command")
	}
	return nil
}

// DecideSnapshots says whether a removal may delete sb's snapshots: only
// when asked to (rm --with-snapshots), since a snapshot is often what the
// operator meant to keep.
func DecideSnapshots(sb projections.Sandbox, with bool) error {
	if with || len(sb.Snapshots) == 0 {
		return nil
	}
	return &Refusal{Command: Remove, Entity: Sandbox(sb.ID),
		Reason: fmt.Sprintf("it has %d snapshot(s) (%s); remove them with `nexus snapshot rm` or pass --with-snapshots", len(sb.Snapshots), strings.Join(sb.Snapshots, ", "))}
}

// DecideVolumeRemove says whether a volume may be deleted: it must exist and
// no sandbox that still exists may have it attached.
func DecideVolumeRemove(v *projections.Volume, name string, live map[string]bool) error {
	if v == nil {
		return &Refusal{Command: "volume rm", Entity: Volume(name), Reason: "no such volume"}
	}
	var users []string
	for _, sb := range v.AttachedTo {
		if live == nil || live[sb] {
			users = append(users, sb)
		}
	}
	if len(users) > 0 {
		return &Refusal{Command: "volume rm", Entity: Volume(name),
			Reason: fmt.Sprintf("it is attached to %s; remove or stop using those sandboxes first", strings.Join(users, ", "))}
	}
	return nil
}

// DecideAttach says whether a create may attach a volume writable: it must
// exist and be attached to no sandbox (a writable volume is never shared).
func DecideAttach(v *projections.Volume, name string) error {
	if v == nil {
		return &Refusal{Command: "attach", Entity: Volume(name), Reason: "no such volume (create it with `nexus volume create`)"}
	}
	if len(v.AttachedTo) > 0 {
		return &Refusal{Command: "attach", Entity: Volume(name),
			Reason: fmt.Sprintf("it is attached to %s; a writable volume is never shared", strings.Join(v.AttachedTo, ", "))}
	}
	return nil
}
