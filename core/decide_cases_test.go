package core

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestDecideCases runs testdata/decide.txt: a command on one sandbox or
// volume in a given state, with the sagas the journal shows open, and what
// the decision is.
//
//	decide cmd=<command> state=<state> [vmm=none|live|exited] [open=<kind>] [open-elsewhere=<kind>] [shadow]
//	snapshots [snapshots=S1,S2] [with]
//	volume-rm [missing] [attached=A,B] [live=A,...]
//	attach [missing] [attached=A]
//
// The sandbox is A. Its VMM is by default live when running, exited when
// exited, and none otherwise. open= is a saga (S1) open on A,
// open-elsewhere= one (S2) open on another sandbox. live= names the
// sandboxes that still exist; without it every attachment counts.
func TestDecideCases(t *testing.T) {
	var cmds []Command
	var states []projections.State
	runCases(t, "testdata/decide.txt", func(t *testing.T, c testCase) string {
		switch c.cmd {
		case "decide":
			c.only(t, "cmd", "state", "vmm", "open", "open-elsewhere", "shadow")
			cmd, st := Command(c.args["cmd"]), projections.State(c.args["state"])
			if cmd == "" || st == "" {
				t.Fatalf("%s: decide needs cmd= and state=", c.pos)
			}
			sb := projections.Sandbox{ID: "A", State: st}
			if _, ok := c.arg("shadow"); ok {
				sb.Handle = "web"
				sb.Resources = []events.Resource{{Kind: events.KindShadowDisk, Path: "disks/web.shadow.cfg.ext4"}}
			}
			vmm, ok := c.arg("vmm")
			if !ok {
				vmm = map[projections.State]string{projections.StateRunning: "live", projections.StateExited: "exited"}[st]
			}
			switch vmm {
			case "", "none":
			case "live":
				sb.VMM = &projections.Process{Pid: 1}
			case "exited":
				sb.VMM = &projections.Process{Pid: 1, Exited: true}
			default:
				t.Fatalf("%s: vmm=%s", c.pos, vmm)
			}
			var open []projections.OpenSaga
			if k, ok := c.arg("open-elsewhere"); ok {
				open = append(open, projections.OpenSaga{ID: "S2", Kind: events.SagaKind(k), Sandbox: "B"})
			}
			if k, ok := c.arg("open"); ok {
				open = append(open, projections.OpenSaga{ID: "S1", Kind: events.SagaKind(k), Sandbox: "A"})
			}
			cmds, states = append(cmds, cmd), append(states, st)
			return decided(Decide(cmd, sb, open))
		case "snapshots":
			c.only(t, "snapshots", "with")
			sb := projections.Sandbox{ID: "A", Snapshots: list(c, "snapshots")}
			_, with := c.arg("with")
			return decided(DecideSnapshots(sb, with))
		case "volume-rm", "attach":
			c.only(t, "missing", "attached", "live")
			var v *projections.Volume
			if _, missing := c.arg("missing"); !missing {
				v = &projections.Volume{Name: "v", AttachedTo: list(c, "attached")}
			}
			if c.cmd == "attach" {
				return decided(DecideAttach(v, "v"))
			}
			var live map[string]bool
			if _, ok := c.arg("live"); ok {
				live = map[string]bool{}
				for _, sb := range list(c, "live") {
					live[sb] = true
				}
			}
			return decided(DecideVolumeRemove(v, "v", live))
		}
		t.Fatalf("%s: unknown command %q", c.pos, c.cmd)
		return ""
	})
	// The file decides every command and sees every state.
	for _, cmd := range []Command{Start, Stop, Remove, ForceRemove, SnapshotRemove, Snapshot, Fork, Restore} {
		if !slices.Contains(cmds, cmd) {
			t.Errorf("testdata/decide.txt decides no %q", cmd)
		}
	}
	for _, st := range []projections.State{projections.StateCreating, projections.StateStopped, projections.StateRunning, projections.StateExited, projections.StateError} {
		if !slices.Contains(states, st) {
			t.Errorf("testdata/decide.txt has no sandbox %s", st)
		}
	}
}

// decided prints a decision: ok, already, or refused and why (and the
// saga that blocks it, which a caller holding the lease finishes).
func decided(err error) string {
	var r *Refusal
	var a *Already
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &a) && !errors.Is(err, ErrRefused):
		return fmt.Sprintf("already %s", a.State)
	case errors.As(err, &r) && errors.Is(err, ErrRefused):
		out := "refused: " + r.Reason
		if r.Saga != nil {
			out += fmt.Sprintf("\nblocked by saga %s (%s on %s)", r.Saga.ID, r.Saga.Kind, r.Saga.Sandbox)
		}
		return out
	}
	return fmt.Sprintf("error, neither a refusal nor already: %v", err)
}
