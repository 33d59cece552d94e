package projections

import (
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"

	"github.com/nexus-sandbox/nexus/events"
)

// applyCase is one row of TestSandboxesApplyEveryEvent: a sandbox as the
// view holds it (nil: the view has never seen it), one event about it, and
// the sandbox the view must hold afterwards (nil: not in the view).
type applyCase struct {
	name  string
	given func() *Sandbox
	event events.Payload
	saga  string
	// noSandbox sends the event with no sandbox id, as volumes, reaps,
	// runs, the image cache and the mirror are journaled.
	noSandbox bool
	want      func(sb *Sandbox) *Sandbox // gets a fresh copy of given()
}

const (
	applyID  = "01JEFFECTS0000000000000001"
	applySeq = 10
)

var (
	applyAt = t0.Add(time.Minute)

	resWS     = events.Resource{Kind: events.KindWorkspaceDisk, Path: "disks/" + applyID + "-workspace.ext4"}
	resRaw    = events.Resource{Kind: events.KindRawDisk, Path: "disks/" + applyID + ".raw"}
	resIntent = events.Resource{Kind: events.KindCreateIntent, Path: "disks/" + applyID + ".create-intent.json"}
	resSock   = events.Resource{Kind: events.KindAPISocket, Path: "run/sb-" + applyID + ".sock"}
	resState  = events.Resource{Kind: events.KindSupervisorState, Path: "supervisors/" + applyID}
	resSnap1  = events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + applyID + "/s1"}
	resRecord = events.Resource{Kind: events.KindRecord, Path: "records/" + applyID}
)

// creating is a sandbox whose create saga s1 has claimed its intent.
func creating() *Sandbox {
	return &Sandbox{ID: applyID, State: StateCreating, Saga: "s1", CreatedAt: t0, UpdatedAt: t0, Seq: 1, Rev: 1,
		Resources: []events.Resource{resIntent}}
}

// stopped is a committed sandbox with no VMM.
func stoppedSB() *Sandbox {
	return &Sandbox{ID: applyID, Handle: "web", Image: "base", Driver: "process", State: StateStopped,
		CreatedAt: t0, UpdatedAt: t0, Seq: 2, Rev: 2, Resources: []events.Resource{resWS}}
}

// running has a VMM (pid 101) and a supervisor (pid 201) and run r1.
func runningSB() *Sandbox {
	sb := stoppedSB()
	sb.State = StateRunning
	sb.VMM = &Process{Pid: 101, StartTicks: 7}
	sb.Supervisor = &Process{Pid: 201, StartTicks: 8}
	sb.Resources = append(sb.Resources, resSock, resState)
	sb.LastRun = "r1"
	return sb
}

func none() *Sandbox { return nil }

// touched is what every applied event about a sandbox in the view does.
func touched(sb *Sandbox) *Sandbox {
	sb.UpdatedAt, sb.Seq, sb.Rev = applyAt, applySeq, applySeq
	return sb
}

// revOnly is an event that names the sandbox but changes nothing of it.
func revOnly(sb *Sandbox) *Sandbox {
	sb.Rev = applySeq
	return sb
}

func unchanged(sb *Sandbox) *Sandbox { return sb }

func applyCases() []applyCase {
	touchOnly := func(name string, given func() *Sandbox, p events.Payload) applyCase {
		return applyCase{name: name, given: given, event: p, want: touched}
	}
	elsewhere := func(name string, p events.Payload) applyCase {
		return applyCase{name: name, given: runningSB, event: p, noSandbox: true, want: unchanged}
	}
	return []applyCase{
		// Sagas: only a creating kind brings a sandbox into the view, and
		// only its own compensation takes it out.
		{name: "create saga adds a creating sandbox", given: none, saga: "s1",
			event: events.SagaStartedEvent{Kind: events.SagaCreate},
			want: func(*Sandbox) *Sandbox {
				return &Sandbox{ID: applyID, State: StateCreating, Saga: "s1", CreatedAt: applyAt, UpdatedAt: applyAt, Seq: applySeq, Rev: applySeq}
			}},
		{name: "fork saga adds a creating sandbox", given: none, saga: "s1",
			event: events.SagaStartedEvent{Kind: events.SagaFork},
			want: func(*Sandbox) *Sandbox {
				return &Sandbox{ID: applyID, State: StateCreating, Saga: "s1", CreatedAt: applyAt, UpdatedAt: applyAt, Seq: applySeq, Rev: applySeq}
			}},
		{name: "restore saga adds a creating sandbox", given: none, saga: "s1",
			event: events.SagaStartedEvent{Kind: events.SagaRestore},
			want: func(*Sandbox) *Sandbox {
				return &Sandbox{ID: applyID, State: StateCreating, Saga: "s1", CreatedAt: applyAt, UpdatedAt: applyAt, Seq: applySeq, Rev: applySeq}
			}},
		{name: "start saga of an unseen sandbox adds nothing", given: none, saga: "s2",
			event: events.SagaStartedEvent{Kind: events.SagaStart}, want: unchanged},
		{name: "start saga leaves a committed sandbox untouched", given: stoppedSB, saga: "s2",
			event: events.SagaStartedEvent{Kind: events.SagaStart}, want: revOnly},
		{name: "create saga of a committed sandbox recreates nothing", given: stoppedSB, saga: "s2",
			event: events.SagaStartedEvent{Kind: events.SagaCreate}, want: revOnly},
		{name: "compensated create leaves the view", given: creating, saga: "s1",
			event: events.SagaCompensatedEvent{Reason: "ENOSPC"}, want: func(*Sandbox) *Sandbox { return nil }},
		{name: "compensation of another saga keeps a creating sandbox", given: creating, saga: "s9",
			event: events.SagaCompensatedEvent{Reason: "ENOSPC"}, want: revOnly},
		{name: "compensation never removes a committed sandbox", given: stoppedSB, saga: "s1",
			event: events.SagaCompensatedEvent{Reason: "ENOSPC"}, want: revOnly},
		touchOnly("finished saga changes nothing", runningSB, events.SagaFinishedEvent{}),

		// A rename changes the handle and nothing else: labels, state and
		// resources stay.
		{name: "renamed takes the new handle", given: runningSB,
			event: events.SandboxRenamedEvent{Old: "web", Handle: "web/old"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Handle = "web/old"
				return touched(sb)
			}},
		{name: "renamed of an unseen sandbox adds nothing", given: none,
			event: events.SandboxRenamedEvent{Old: "web", Handle: "web/old"}, want: unchanged},

		// Commits claim their resources and settle the sandbox stopped.
		{name: "created commits a creating sandbox and claims", given: creating, saga: "s1",
			event: events.SandboxCreatedEvent{Handle: "web", Image: "base", Driver: "process", Resources: []events.Resource{resIntent, resWS}},
			want: func(sb *Sandbox) *Sandbox {
				sb.Handle, sb.Image, sb.Driver, sb.State, sb.Saga = "web", "base", "process", StateStopped, ""
				sb.Resources = []events.Resource{resIntent, resWS} // the intent is not claimed twice
				return touched(sb)
			}},
		{name: "created of an unseen sandbox commits it", given: none,
			event: events.SandboxCreatedEvent{Handle: "web", Image: "base", Driver: "process", Resources: []events.Resource{resWS, {Kind: events.KindRecord}}},
			want: func(*Sandbox) *Sandbox {
				return touched(&Sandbox{ID: applyID, Handle: "web", Image: "base", Driver: "process", State: StateStopped,
					CreatedAt: applyAt, Resources: []events.Resource{resWS}}) // a resource without a path is no claim
			}},
		{name: "forked commits with its parent", given: creating, saga: "s1",
			event: events.SandboxForkedEvent{Parent: "P", Handle: "kid", Image: "base", Driver: "process", Resources: []events.Resource{resWS}},
			want: func(sb *Sandbox) *Sandbox {
				sb.Handle, sb.Image, sb.Driver, sb.State, sb.Saga, sb.Parent = "kid", "base", "process", StateStopped, "", "P"
				sb.Resources = append(sb.Resources, resWS)
				return touched(sb)
			}},
		{name: "restored commits with its source and snapshot", given: creating, saga: "s1",
			event: events.SandboxRestoredEvent{Snapshot: "s1", Source: "S", Image: "base", Driver: "process", Resources: []events.Resource{resWS}},
			want: func(sb *Sandbox) *Sandbox {
				sb.Image, sb.Driver, sb.State, sb.Saga, sb.Parent, sb.Snapshot = "base", "process", StateStopped, "", "S", "s1"
				sb.Resources = append(sb.Resources, resWS)
				return touched(sb)
			}},

		// Runs.
		{name: "started runs, claims its sockets, clears conditions",
			given: func() *Sandbox {
				sb := stoppedSB()
				sb.Conditions = []Condition{{Type: ConditionReady, Status: "False", Reason: "Old"}}
				sb.LastRun = "r0"
				return sb
			},
			event: events.SandboxStartedEvent{Driver: "process", VMMPid: 101, VMMStart: 7, Sockets: []events.Resource{resSock}, RunMarker: "r1"},
			want: func(sb *Sandbox) *Sandbox {
				sb.State, sb.VMM, sb.LastRun, sb.Conditions = StateRunning, &Process{Pid: 101, StartTicks: 7}, "r1", nil
				sb.Resources = append(sb.Resources, resSock)
				sb.BootAt = applyAt
				return touched(sb)
			}},
		{name: "started forgets the previous run's Ready",
			given: func() *Sandbox {
				sb := stoppedSB()
				sb.BootAt, sb.ReadyAt = t0, t0
				return sb
			},
			event: events.SandboxStartedEvent{Driver: "process", VMMPid: 101, VMMStart: 7, RunMarker: "r2"},
			want: func(sb *Sandbox) *Sandbox {
				sb.State, sb.VMM, sb.LastRun = StateRunning, &Process{Pid: 101, StartTicks: 7}, "r2"
				sb.BootAt, sb.ReadyAt = applyAt, time.Time{}
				return touched(sb)
			}},
		{name: "ready of the current run makes it Ready and drops AgentNotReady",
			given: func() *Sandbox {
				sb := runningSB()
				sb.Conditions = []Condition{{Type: ConditionReady, Status: "False", Reason: ReasonAgentNotReady}}
				return sb
			},
			event: events.SandboxReadyEvent{Run: "r1", By: "agent"},
			want: func(sb *Sandbox) *Sandbox {
				sb.ReadyAt, sb.Conditions = applyAt, nil
				return touched(sb)
			}},
		touchOnly("ready of an older run changes nothing", runningSB, events.SandboxReadyEvent{Run: "r0", By: "agent"}),
		touchOnly("ready of a stopped sandbox changes nothing", stoppedSB, events.SandboxReadyEvent{Run: "", By: "agent"}),
		{name: "not ready of the current run says why", given: runningSB,
			event: events.SandboxNotReadyEvent{Run: "r1", Reason: ReasonAgentNotReady, Message: "m"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Conditions = []Condition{{Type: ConditionReady, Status: "False", Reason: ReasonAgentNotReady, Message: "m"}}
				return touched(sb)
			}},
		touchOnly("not ready after ready changes nothing", func() *Sandbox {
			sb := runningSB()
			sb.ReadyAt = t0
			return sb
		}, events.SandboxNotReadyEvent{Run: "r1", Reason: ReasonAgentNotReady}),
		{name: "started of an unseen sandbox adds nothing", given: none,
			event: events.SandboxStartedEvent{VMMPid: 101, Sockets: []events.Resource{resSock}}, want: unchanged},
		{name: "stopped drops the VMM and keeps every resource", given: runningSB,
			event: events.SandboxStoppedEvent{Reason: "user"},
			want: func(sb *Sandbox) *Sandbox {
				sb.State, sb.VMM = StateStopped, nil
				return touched(sb)
			}},
		{name: "failed drops the VMM and says why", given: runningSB,
			event: events.SandboxFailedEvent{Reason: "OverlayDiskFull", Message: "full"},
			want: func(sb *Sandbox) *Sandbox {
				sb.State, sb.VMM = StateError, nil
				sb.Conditions = []Condition{{Type: "Ready", Status: "False", Reason: "OverlayDiskFull", Message: "full"}}
				return touched(sb)
			}},
		{name: "removed leaves the view with its resources", given: runningSB,
			event: events.SandboxRemovedEvent{}, want: func(*Sandbox) *Sandbox { return nil }},
		{name: "vmm exit of the recorded VMM makes a running sandbox exited", given: runningSB,
			event: events.VMMExitedEvent{Pid: 101, StartTicks: 7, Status: events.ExitExited, Code: 3, By: "daemon"},
			want: func(sb *Sandbox) *Sandbox {
				sb.State, sb.VMM = StateExited, &Process{Pid: 101, StartTicks: 7, Exited: true}
				sb.Conditions = []Condition{{Type: ConditionReady, Status: "False", Reason: ReasonVMMExited, Message: "VMM pid 101 exited with status 3"}}
				return touched(sb)
			}},
		touchOnly("vmm exit of a reused pid changes nothing", runningSB,
			events.VMMExitedEvent{Pid: 101, StartTicks: 99, Status: events.ExitUnknown, By: "daemon"}),
		{name: "supervisor exit of the recorded supervisor", given: runningSB,
			event: events.SupervisorExitedEvent{Pid: 201, StartTicks: 8, Status: events.ExitKilled, Code: 9, Signal: "SIGKILL", By: "daemon"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Supervisor = &Process{Pid: 201, StartTicks: 8, Exited: true}
				sb.Conditions = []Condition{{Type: ConditionSupervisor, Status: "False", Reason: ReasonSupExited, Message: "supervisor pid 201 killed by SIGKILL"}}
				return touched(sb)
			}},
		touchOnly("supervisor exit of a reused pid changes nothing", runningSB,
			events.SupervisorExitedEvent{Pid: 201, StartTicks: 99, Status: events.ExitUnknown, By: "daemon"}),
		{name: "supervisor started claims its state dir and clears its condition",
			given: func() *Sandbox {
				sb := stoppedSB()
				sb.Conditions = []Condition{{Type: ConditionReady, Status: "False"}, {Type: ConditionSupervisor, Status: "False"}}
				return sb
			},
			event: events.SupervisorStartedEvent{Pid: 202, Start: 9, Socket: "run/x.sock", StateDir: resState},
			want: func(sb *Sandbox) *Sandbox {
				sb.Supervisor = &Process{Pid: 202, StartTicks: 9}
				sb.Resources = append(sb.Resources, resState)
				sb.Conditions = []Condition{{Type: ConditionReady, Status: "False"}}
				return touched(sb)
			}},
		{name: "supervisor stopped forgets it and keeps its state dir", given: runningSB,
			event: events.SupervisorStoppedEvent{Pid: 201, Reason: "stop"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Supervisor = nil
				return touched(sb)
			}},

		// Claims and releases.
		{name: "disk materialised claims the disk", given: creating,
			event: events.DiskMaterialisedEvent{Resource: resRaw, Method: "sparse-copy"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Resources = append(sb.Resources, resRaw)
				return touched(sb)
			}},
		{name: "intent written claims the intent",
			given: func() *Sandbox { sb := creating(); sb.Resources = nil; return sb },
			event: events.IntentWrittenEvent{Resource: resIntent, Covers: []string{resRaw.Path}},
			want: func(sb *Sandbox) *Sandbox {
				sb.Resources = []events.Resource{resIntent}
				return touched(sb)
			}},
		{name: "intent retired releases the intent",
			given: func() *Sandbox { sb := stoppedSB(); sb.Resources = []events.Resource{resIntent, resWS}; return sb },
			event: events.IntentRetiredEvent{Resource: resIntent},
			want: func(sb *Sandbox) *Sandbox {
				sb.Resources = []events.Resource{resWS}
				return touched(sb)
			}},
		{name: "resource created claims it", given: stoppedSB,
			event: events.ResourceCreatedEvent{Resource: resRecord},
			want: func(sb *Sandbox) *Sandbox {
				sb.Resources = append(sb.Resources, resRecord)
				return touched(sb)
			}},
		touchOnly("resource created of an owned path claims nothing twice", stoppedSB,
			events.ResourceCreatedEvent{Resource: resWS}),
		{name: "resource created of an unseen sandbox claims nothing", given: none,
			event: events.ResourceCreatedEvent{Resource: resRecord}, want: unchanged},
		{name: "resource reclaimed releases it", given: runningSB,
			event: events.ResourceReclaimedEvent{Resource: resSock, By: "stop"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Resources = []events.Resource{resWS, resState}
				return touched(sb)
			}},
		{name: "reclaiming the last resource leaves none", given: stoppedSB,
			event: events.ResourceReclaimedEvent{Resource: resWS, By: "rm"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Resources = nil
				return touched(sb)
			}},
		{name: "reclaimed snapshot dir forgets the snapshot",
			given: func() *Sandbox {
				sb := stoppedSB()
				sb.Resources = append(sb.Resources, resSnap1)
				sb.Snapshots = []string{"s1", "s2"}
				return sb
			},
			event: events.ResourceReclaimedEvent{Resource: resSnap1, By: "snapshot-rm"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Resources, sb.Snapshots = []events.Resource{resWS}, []string{"s2"}
				return touched(sb)
			}},
		{name: "snapshot taken claims its dir and lists it", given: stoppedSB,
			event: events.SnapshotTakenEvent{SnapshotID: "s1", Dir: resSnap1},
			want: func(sb *Sandbox) *Sandbox {
				sb.Resources = append(sb.Resources, resSnap1)
				sb.Snapshots = []string{"s1"}
				return touched(sb)
			}},

		// Volumes.
		{name: "volume attached is listed", given: stoppedSB,
			event: events.VolumeAttachedEvent{Name: "data", GuestPath: "/data", ReadOnly: true},
			want: func(sb *Sandbox) *Sandbox {
				sb.Volumes = []Attachment{{Name: "data", GuestPath: "/data", ReadOnly: true}}
				return touched(sb)
			}},
		{name: "volume detached is unlisted",
			given: func() *Sandbox {
				sb := stoppedSB()
				sb.Volumes = []Attachment{{Name: "a", GuestPath: "/a"}, {Name: "b", GuestPath: "/b"}}
				return sb
			},
			event: events.VolumeDetachedEvent{Name: "a"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Volumes = []Attachment{{Name: "b", GuestPath: "/b"}}
				return touched(sb)
			}},
		{name: "detaching the last volume leaves none",
			given: func() *Sandbox { sb := stoppedSB(); sb.Volumes = []Attachment{{Name: "a", GuestPath: "/a"}}; return sb },
			event: events.VolumeDetachedEvent{Name: "a"},
			want: func(sb *Sandbox) *Sandbox {
				sb.Volumes = nil
				return touched(sb)
			}},
		elsewhere("volume created belongs to no sandbox", events.VolumeCreatedEvent{Name: "data", Path: "volumes/data"}),
		elsewhere("volume removed belongs to no sandbox", events.VolumeRemovedEvent{Name: "data"}),

		// Flush markers: only the current run's acknowledgement counts.
		{name: "flush pending sets the run", given: runningSB,
			event: events.FlushPendingEvent{Run: "r2", Previous: "r1"},
			want: func(sb *Sandbox) *Sandbox {
				sb.LastRun = "r2"
				return touched(sb)
			}},
		{name: "flush acknowledged of the current run", given: runningSB,
			event: events.FlushAcknowledgedEvent{Run: "r1"},
			want: func(sb *Sandbox) *Sandbox {
				sb.FlushedRun = "r1"
				return touched(sb)
			}},
		touchOnly("flush acknowledged of an older run vouches for nothing", runningSB,
			events.FlushAcknowledgedEvent{Run: "r0"}),
		{name: "flush restored puts the previous run back", given: runningSB,
			event: events.FlushRestoredEvent{Run: "r1", Previous: "r0", PreviousFlushed: "r0"},
			want: func(sb *Sandbox) *Sandbox {
				sb.LastRun, sb.FlushedRun = "r0", "r0"
				return touched(sb)
			}},
		touchOnly("flush restored of another run changes nothing", runningSB,
			events.FlushRestoredEvent{Run: "r9", Previous: "r0"}),

		// Facts the view does not fold.
		touchOnly("overlay recovered changes nothing", stoppedSB, events.OverlayRecoveredEvent{Overlay: resWS.Path}),
		touchOnly("warning raised changes nothing", runningSB, events.WarningRaisedEvent{Reason: "OverlayDiskFull"}),
		elsewhere("reap decided", events.ReapDecidedEvent{Plan: "p", Part: 1, Parts: 1,
			Entries: []events.ReapEntry{{Kind: events.KindWorkspaceDisk, Path: resWS.Path, Verdict: "orphan"}}}),
		elsewhere("reap applied", events.ReapAppliedEvent{Plan: "p", Part: 1, Parts: 1,
			Deleted: []events.ReapEntry{{Kind: events.KindWorkspaceDisk, Path: resWS.Path}}}),
		elsewhere("run swept", events.RunSweptEvent{RunID: "r1", Verdict: "swept"}),
		elsewhere("run kept", events.RunKeptEvent{By: "cli", Part: 1, Parts: 1}),
		elsewhere("image cache prepared", events.ImageCachePreparedEvent{CacheID: "c"}),
		elsewhere("image cache used", events.ImageCacheUsedEvent{CacheID: "c"}),
		elsewhere("image cache pruned", events.ImageCachePrunedEvent{CacheID: "c"}),
		elsewhere("mirror created", events.MirrorCreatedEvent{Stream: "m"}),
		elsewhere("mirror recreated", events.MirrorRecreatedEvent{Stream: "m"}),
		elsewhere("mirror linked", events.MirrorLinkedEvent{Stream: "m"}),
		elsewhere("mirror unlinked", events.MirrorUnlinkedEvent{Stream: "m"}),
		elsewhere("mirror settings differ", events.MirrorSettingsDifferEvent{Stream: "m"}),
		elsewhere("mirror refused", events.MirrorRefusedEvent{Stream: "m"}),
		// A claim is the handle's event: the commit beside it gave the handle.
		elsewhere("handle claimed", events.HandleClaimedEvent{Sandbox: applyID, Handle: "web"}),
		elsewhere("journal digest", events.JournalDigestEvent{Seq: 7, Digest: "00"}),
	}
}

// TestSandboxesApplyEveryEvent is the effect of each event type on one
// sandbox: state, processes, conditions, resources and the view's indexes.
// A new event type fails it until it has a row.
func TestSandboxesApplyEveryEvent(t *testing.T) {
	cases := applyCases()
	covered := map[events.Type]bool{}
	for _, c := range cases {
		covered[c.event.EventType()] = true
	}
	for _, typ := range events.Types() {
		if !covered[typ] {
			t.Errorf("event type %s has no row in applyCases: say what it does to a sandbox", typ)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			view := seededView(t, c.given())
			before := c.given()
			sandbox := applyID
			if c.noSandbox {
				sandbox = ""
			}
			e := events.New(ulid.Make(), applyAt, sandbox, c.event)
			if c.saga != "" {
				e = e.InSaga(c.saga, "step")
			}
			view.Apply(applySeq, e)
			want := c.want(c.given())

			if view.Seq() != applySeq {
				t.Errorf("Seq() = %d, want %d", view.Seq(), applySeq)
			}
			got := view.Get(applyID)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("after %s:\n got %+v\nwant %+v", e.Type, got, want)
			}
			checkIndexes(t, view, before, want)
			// The fold's answer must survive its own snapshot.
			data, err := view.MarshalState()
			if err != nil {
				t.Fatal(err)
			}
			again := NewSandboxes()
			if err := again.UnmarshalState(applySeq, data); err != nil {
				t.Fatal(err)
			}
			if g := again.Get(applyID); !reflect.DeepEqual(g, want) {
				t.Fatalf("after a snapshot round trip:\n got %+v\nwant %+v", g, want)
			}
		})
	}
}

// seededView is a view holding sb (if any) as its snapshot would.
func seededView(t *testing.T, sb *Sandbox) *Sandboxes {
	t.Helper()
	view := NewSandboxes()
	var list []*Sandbox
	if sb != nil {
		list = append(list, sb)
	}
	data, err := msgpack.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	if err := view.UnmarshalState(1, data); err != nil {
		t.Fatal(err)
	}
	return view
}

// checkIndexes asserts the handle and owner indexes agree with want: every
// path it owns answers with it, every path it gave up answers with nobody.
func checkIndexes(t *testing.T, view *Sandboxes, before, want *Sandbox) {
	t.Helper()
	if n := map[bool]int{true: 1, false: 0}[want != nil]; view.Len() != n {
		t.Errorf("Len() = %d, want %d", view.Len(), n)
	}
	var owned []string
	if want != nil {
		for _, r := range want.Resources {
			owned = append(owned, r.Path)
			if id, p, ok := view.OwnerOf([]string{r.Path}, ""); !ok || id != applyID || p != r.Path {
				t.Errorf("OwnerOf(%s) = %q %q %v, want %s", r.Path, id, p, ok, applyID)
			}
		}
		if want.Handle != "" && view.ByHandle(want.Handle) != view.Get(applyID) {
			t.Errorf("ByHandle(%q) does not find the sandbox", want.Handle)
		}
	}
	if before == nil {
		return
	}
	for _, r := range before.Resources {
		if slices.Contains(owned, r.Path) {
			continue
		}
		if id, _, ok := view.OwnerOf([]string{r.Path}, ""); ok {
			t.Errorf("OwnerOf(%s) = %s after it was released", r.Path, id)
		}
	}
	if before.Handle != "" && (want == nil || want.Handle != before.Handle) && view.ByHandle(before.Handle) != nil {
		t.Errorf("ByHandle(%q) still answers", before.Handle)
	}
}

// TestPathOwnerIsTheRuleOverTheList folds random histories, restored from
// a snapshot or not, and asks PathOwner about every owned path, each
// directory holding one, each directory above one, and paths no one owns:
// its indexes answer what the rule says over the list of sandboxes.
func TestPathOwnerIsTheRuleOverTheList(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		evs := genHistory(t)
		s := NewSandboxes()
		fold(s, evs, 0)
		if rapid.Bool().Draw(t, "restored") {
			data, _ := s.MarshalState()
			r := NewSandboxes()
			if err := r.UnmarshalState(s.Seq(), data); err != nil {
				t.Fatal(err)
			}
			s = r
		}
		list := s.List()
		rule := func(rel string) (string, bool) {
			id, ok, _ := PathOwner(rel, func(p string) (string, bool, error) {
				for _, sb := range list {
					if sb.Owns(p) {
						return sb.ID, true, nil
					}
				}
				return "", false, nil
			}, func(dir string) (string, bool, error) {
				if !strings.Contains(dir, "/") {
					return "", false, nil
				}
				for _, sb := range list {
					for _, r := range sb.Resources {
						if strings.HasPrefix(r.Path, dir+"/") {
							return sb.ID, true, nil
						}
					}
				}
				return "", false, nil
			})
			return id, ok
		}
		asked := []string{"disks/nobody.raw", "snapshots/nobody", "disks", "snapshots"}
		for _, sb := range list {
			for _, r := range sb.Resources {
				asked = append(asked, r.Path, r.Path+"/below", path.Dir(r.Path))
			}
		}
		for _, p := range asked {
			gid, gok := s.PathOwner(p)
			wid, wok := rule(p)
			if gid != wid || gok != wok {
				t.Fatalf("PathOwner(%s) = %q %v, the rule over the list says %q %v", p, gid, gok, wid, wok)
			}
		}
	})
}

// Readiness is what inspect, ls and --json show: Ready only for the
// running run that reported it, else why not.
func TestReadiness(t *testing.T) {
	ready := func() *Sandbox { sb := runningSB(); sb.ReadyAt = t0; return sb }
	for _, c := range []struct {
		name  string
		sb    *Sandbox
		ready bool
		why   string
	}{
		{"running, reported Ready", ready(), true, ""},
		{"running, not reported", runningSB(), false, ReasonBooting},
		{"running, not Ready in time", func() *Sandbox {
			sb := runningSB()
			sb.Conditions = []Condition{{Type: ConditionReady, Status: "False", Reason: ReasonAgentNotReady}}
			return sb
		}(), false, ReasonAgentNotReady},
		{"its VMM exited", func() *Sandbox {
			sb := ready()
			sb.vmmExited(events.ProcessExit{Pid: 101, StartTicks: 7, Status: events.ExitUnknown}, "")
			return sb
		}(), false, ReasonVMMExited},
		{"stopped after a Ready run", func() *Sandbox { sb := stoppedSB(); sb.ReadyAt = t0; return sb }(), false, ReasonNotRunning},
	} {
		if ok, why := c.sb.Readiness(); ok != c.ready || why != c.why {
			t.Errorf("%s: Readiness %v %q, want %v %q", c.name, ok, why, c.ready, c.why)
		}
	}
}
