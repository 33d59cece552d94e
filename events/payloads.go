package events

// ResourceKind names a class of host resource nexus owns. The names are the
// `kind` field of `nexus reap --json`.
type ResourceKind string

const (
	KindRawDisk       ResourceKind = "raw-disk"
	KindWorkspaceDisk ResourceKind = "workspace-disk"
	KindCreateIntent  ResourceKind = "create-intent"
	KindShadowIntent  ResourceKind = "shadow-intent"
	KindShadowDisk    ResourceKind = "shadow-disk"
	KindAPISocket     ResourceKind = "api-socket"
	// KindAPISocketLock is the lock file Cloud Hypervisor v53+ creates
	// beside its API socket (<socket>.lock) and leaves at exit.
	KindAPISocketLock     ResourceKind = "api-socket-lock"
	KindVsockSocket       ResourceKind = "vsock-socket"
	KindIIDSocket         ResourceKind = "iid-socket"
	KindSupervisorState   ResourceKind = "supervisor-state"
	KindBuilderSupervisor ResourceKind = "builder-supervisor"
	KindSnapshot          ResourceKind = "snapshot"
	KindCgroup            ResourceKind = "cgroup"
	KindRecord            ResourceKind = "record"
	// KindOverlayStaging is the private copy an overlay recovery repairs
	// and grows before publishing it over the workspace disk.
	KindOverlayStaging ResourceKind = "overlay-staging"
	// KindSupervisorProcess is a detached supervisor process, orphaned when
	// its sandbox is gone and it still runs; its
	// path in a reap report is /proc/<pid>.
	KindSupervisorProcess ResourceKind = "supervisor-process"
	// KindLog is one of a sandbox's logs under logs/ (<id>.vmm.log,
	// <id>.supervisor.log, <id>.console.log and the console's time index
	// <id>.console.idx): claimed when a boot first writes it, removed by
	// rm, reapable once its sandbox is gone.
	KindLog ResourceKind = "log"
	// KindWatchdogLog is a client run's watchdog log under logs/
	// (run-<run>.watchdog.log): no sandbox's, never journaled; the ledger
	// removes it with its run, and a reap finds it orphaned once the run's
	// record is gone.
	KindWatchdogLog ResourceKind = "watchdog-log"
)

// Resource is one host resource, by kind and path relative to the state
// root (relative so a journal copied elsewhere still describes its tree).
type Resource struct {
	Kind ResourceKind `msgpack:"kind" json:"kind"`
	Path string       `msgpack:"path" json:"path"`
}

// SandboxCreatedEvent (schema 5) says: the sandbox is
// committed, and it owns every resource listed. Bootstrap names the image
// cache entry its OS disk was cloned from (schema 3); a sandbox without it
// predates the image cache and protects every entry from prune. Driver and
// Boot (schema 4) are how every boot of the sandbox runs. Labels (schema 5)
// are the operator's key=value labels. Boot's Root (schema 6) says whether
// its guest boots on the entry itself, read-only under an overlay, or on a
// private copy.
type SandboxCreatedEvent struct {
	Handle    string     `msgpack:"handle,omitempty" json:"handle,omitempty"`
	Image     string     `msgpack:"image" json:"image"`
	Driver    string     `msgpack:"driver" json:"driver"`
	Resources []Resource `msgpack:"resources" json:"resources"`
	Bootstrap Bootstrap  `msgpack:"bootstrap,omitempty" json:"bootstrap,omitempty"`
	Boot      BootConfig `msgpack:"boot,omitempty" json:"boot,omitempty"`
	Labels    Labels     `msgpack:"labels,omitempty" json:"labels,omitempty"`
}

// BootConfig is how a sandbox boots, beside its Driver: every later boot
// of the sandbox (start, recover) and of its fork and restore children
// uses it, whatever the booting command's settings. A zero field was not
// recorded (a sandbox created before schema 4 of sandbox.created): its
// boot uses the booting command's kernel, initramfs and command line, and
// 1 vCPU and 512 MiB, as every boot did then.
type BootConfig struct {
	Kernel      string `msgpack:"kernel,omitempty" json:"kernel,omitempty"`
	Initramfs   string `msgpack:"initramfs,omitempty" json:"initramfs,omitempty"`
	Cmdline     string `msgpack:"cmdline,omitempty" json:"cmdline,omitempty"`
	Cpus        int    `msgpack:"cpus,omitempty" json:"cpus,omitempty"`
	MemoryBytes int64  `msgpack:"memory_bytes,omitempty" json:"memory_bytes,omitempty"`
	// Root is RootOverlay or RootCopy; empty (recorded before
	// sandbox.created schema 5, forked and restored schema 4) is RootCopy,
	// as every OS disk was then.
	Root string `msgpack:"root,omitempty" json:"root,omitempty"`
}

// How a guest's root is made, BootConfig.Root.
const (
	// RootOverlay: the OS disk is the image cache entry itself, attached
	// read-only and shared by every sandbox booted on it; the guest agent,
	// as PID 1, puts an overlay over it whose upper layer is on the
	// sandbox's workspace disk, so every guest write lands there.
	RootOverlay = "overlay"
	// RootCopy: the OS disk is the sandbox's own writable copy of the
	// entry (a guest booted without nexus's agent as its init).
	RootCopy = "copy"
)

// RootMode is b's Root, RootCopy when it was not recorded.
func (b BootConfig) RootMode() string {
	if b.Root == "" {
		return RootCopy
	}
	return b.Root
}

// IsZero lets msgpack and encoding/json omit an unrecorded boot configuration.
func (b BootConfig) IsZero() bool { return b == BootConfig{} }

// Labels are an operator's key=value labels on a sandbox or a volume,
// given when it is made (projections.ParseLabels says which are valid).
type Labels map[string]string

// Bootstrap is the image cache entry a sandbox's OS disk came from: its
// cache ID and the identity of the image it was prepared from. The zero
// value means "not recorded".
type Bootstrap struct {
	CacheID  string `msgpack:"cache_id,omitempty" json:"cache_id,omitempty"`
	Identity string `msgpack:"identity,omitempty" json:"identity,omitempty"`
}

// IsZero lets msgpack and encoding/json omit an unrecorded bootstrap.
func (b Bootstrap) IsZero() bool { return b == Bootstrap{} }

// SandboxForkedEvent: a child sandbox was committed from a running parent.
// Bootstrap (schema 2) is the parent's: the child's OS disk descends from
// the same image cache entry. Driver and Boot (schema 3) are the parent's.
// Labels (schema 4) are the child's own, given to the fork; a child does
// not inherit its parent's. Boot's Root is schema 5.
type SandboxForkedEvent struct {
	Parent    string     `msgpack:"parent" json:"parent"`
	Handle    string     `msgpack:"handle,omitempty" json:"handle,omitempty"`
	Image     string     `msgpack:"image" json:"image"`
	Driver    string     `msgpack:"driver" json:"driver"`
	Resources []Resource `msgpack:"resources" json:"resources"`
	Bootstrap Bootstrap  `msgpack:"bootstrap,omitempty" json:"bootstrap,omitempty"`
	Boot      BootConfig `msgpack:"boot,omitempty" json:"boot,omitempty"`
	Labels    Labels     `msgpack:"labels,omitempty" json:"labels,omitempty"`
}

// SandboxRestoredEvent: a sandbox was committed from a snapshot.
// Bootstrap (schema 2) comes from the snapshot's manifest; a snapshot taken
// before the image cache has none. Driver and Boot (schema 3) are the
// snapshotted sandbox's. Labels (schema 4) are the new sandbox's own,
// given to the restore. Boot's Root is schema 5.
type SandboxRestoredEvent struct {
	Snapshot  string     `msgpack:"snapshot" json:"snapshot"`
	Source    string     `msgpack:"source" json:"source"`
	Handle    string     `msgpack:"handle,omitempty" json:"handle,omitempty"`
	Image     string     `msgpack:"image" json:"image"`
	Driver    string     `msgpack:"driver" json:"driver"`
	Resources []Resource `msgpack:"resources" json:"resources"`
	Bootstrap Bootstrap  `msgpack:"bootstrap,omitempty" json:"bootstrap,omitempty"`
	Boot      BootConfig `msgpack:"boot,omitempty" json:"boot,omitempty"`
	Labels    Labels     `msgpack:"labels,omitempty" json:"labels,omitempty"`
}

// SandboxStartedEvent: the VMM answered on its API socket. The pid and its
// start time (clock ticks since boot, /proc/<pid>/stat field 22) identify
// the process; a pid alone can be reused.
type SandboxStartedEvent struct {
	Driver    string     `msgpack:"driver" json:"driver"`
	VMMPid    int        `msgpack:"pid" json:"pid"`
	VMMStart  uint64     `msgpack:"start_ticks" json:"start_ticks"`
	Sockets   []Resource `msgpack:"sockets" json:"sockets"`
	RunMarker string     `msgpack:"run,omitempty" json:"run,omitempty"`
}

// SandboxReadyEvent: the guest of run Run is Ready: its guest agent
// answered a session (By "agent"), or, for a guest booted without the
// agent, its VMM runs (By "vmm"). BootAtMs is the run's sandbox.started
// time and ReadyAtMs this one (Unix ms), so the time to Ready is audited
// from this event alone.
type SandboxReadyEvent struct {
	Run       string `msgpack:"run" json:"run"`
	By        string `msgpack:"by" json:"by"`
	BootAtMs  int64  `msgpack:"boot_at_ms" json:"boot_at_ms"`
	ReadyAtMs int64  `msgpack:"ready_at_ms" json:"ready_at_ms"`
}

// SandboxNotReadyEvent: the guest of run Run did not become Ready within
// WaitedMs; the sandbox is left running with Ready=False and Reason
// (AgentNotReady). A later sandbox.ready of the same run supersedes it.
type SandboxNotReadyEvent struct {
	Run      string `msgpack:"run" json:"run"`
	Reason   string `msgpack:"reason" json:"reason"`
	Message  string `msgpack:"message" json:"message"`
	WaitedMs int64  `msgpack:"waited_ms" json:"waited_ms"`
}

type SandboxStoppedEvent struct {
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// SandboxFailedEvent puts a sandbox in Error with a condition.
type SandboxFailedEvent struct {
	Reason  string `msgpack:"reason" json:"reason"`
	Message string `msgpack:"message" json:"message"`
}

type SandboxRemovedEvent struct{}

// DiskMaterialisedEvent: a disk file exists and belongs to the sandbox.
type DiskMaterialisedEvent struct {
	Resource       Resource `msgpack:"resource" json:"resource"`
	Method         string   `msgpack:"method" json:"method"` // reflink, sparse-copy, mkfs
	AllocatedBytes int64    `msgpack:"allocated" json:"allocated"`
	ApparentBytes  int64    `msgpack:"apparent" json:"apparent"`
}

// IntentWrittenEvent: a leased intent file is on disk and covers Covers.
type IntentWrittenEvent struct {
	Resource Resource `msgpack:"resource" json:"resource"`
	Covers   []string `msgpack:"covers,omitempty" json:"covers,omitempty"`
}

type IntentRetiredEvent struct {
	Resource Resource `msgpack:"resource" json:"resource"`
}

type SupervisorStartedEvent struct {
	Pid      int      `msgpack:"pid" json:"pid"`
	Start    uint64   `msgpack:"start_ticks" json:"start_ticks"`
	Socket   string   `msgpack:"socket" json:"socket"`
	StateDir Resource `msgpack:"state_dir" json:"state_dir"`
}

type SupervisorStoppedEvent struct {
	Pid    int    `msgpack:"pid" json:"pid"`
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// ProcessExit is what a watcher saw of a recorded process's end: the
// process (pid and start time, as recorded by the event that started it)
// and how it ended. Only the parent learns an exit status from the kernel;
// the daemon that watches is not the parent of the VMMs and supervisors
// commands spawned, so for them Status is "unknown".
type ProcessExit struct {
	Pid        int    `msgpack:"pid" json:"pid"`
	StartTicks uint64 `msgpack:"start_ticks" json:"start_ticks"`
	// Status is "exited" (Code is the exit code), "killed" (Code is the
	// signal number, Signal its name) or "unknown".
	Status string `msgpack:"status" json:"status"`
	Code   int    `msgpack:"code,omitempty" json:"code,omitempty"`
	Signal string `msgpack:"signal,omitempty" json:"signal,omitempty"`
	// By names the watcher ("daemon").
	By string `msgpack:"by" json:"by"`
}

// Exit statuses of a ProcessExit.
const (
	ExitExited  = "exited"
	ExitKilled  = "killed"
	ExitUnknown = "unknown"
)

// VMMExitedEvent: the sandbox's recorded VMM process ended while nothing
// nexus runs was stopping it (no stop, rm, start, recover or create saga of
// the sandbox was open). The sandbox is exited, not running; nothing is
// deleted: stop, rm, recover or start settle it.
type VMMExitedEvent ProcessExit

// SupervisorExitedEvent: the sandbox's recorded supervisor ended while
// nothing nexus runs was stopping it. While the VMM runs, recover replaces
// it, seeded with the persisted CA so the guest's TLS trust still holds.
type SupervisorExitedEvent ProcessExit

type SnapshotTakenEvent struct {
	SnapshotID     string   `msgpack:"snapshot" json:"snapshot"`
	Dir            Resource `msgpack:"dir" json:"dir"`
	AllocatedBytes int64    `msgpack:"allocated" json:"allocated"`
}

// VolumeCreatedEvent: a named volume exists. Labels (schema 2) are the
// operator's key=value labels.
type VolumeCreatedEvent struct {
	Name      string `msgpack:"name" json:"name"`
	Path      string `msgpack:"path" json:"path"`
	SizeBytes int64  `msgpack:"size" json:"size"`
	Labels    Labels `msgpack:"labels,omitempty" json:"labels,omitempty"`
}

type VolumeAttachedEvent struct {
	Name      string `msgpack:"name" json:"name"`
	GuestPath string `msgpack:"guest_path" json:"guest_path"`
	ReadOnly  bool   `msgpack:"read_only,omitempty" json:"read_only,omitempty"`
}

type VolumeDetachedEvent struct {
	Name string `msgpack:"name" json:"name"`
}

type VolumeRemovedEvent struct {
	Name string `msgpack:"name" json:"name"`
}

// FlushAcknowledgedEvent: the guest flushed its filesystem for run Run
// before it stopped; only then may the overlay be trusted offline.
type FlushAcknowledgedEvent struct {
	Run     string `msgpack:"run" json:"run"`
	Overlay string `msgpack:"overlay" json:"overlay"`
}

// FlushPendingEvent: run marker Run is journaled before the VMM of a new
// run spawns, so a run that dies without a FlushAcknowledged for it is
// known to be unacknowledged. Previous and PreviousFlushed are the run
// marker and acknowledgement it replaces, for FlushRestored.
type FlushPendingEvent struct {
	Run             string `msgpack:"run" json:"run"`
	Previous        string `msgpack:"previous,omitempty" json:"previous,omitempty"`
	PreviousFlushed string `msgpack:"previous_flushed,omitempty" json:"previous_flushed,omitempty"`
	Overlay         string `msgpack:"overlay" json:"overlay"`
}

// FlushRestoredEvent: the VMM of run Run failed before a VM existed, so
// the overlay was never used by it: the previous run marker and
// acknowledgement state are back in force.
type FlushRestoredEvent struct {
	Run             string `msgpack:"run" json:"run"`
	Previous        string `msgpack:"previous,omitempty" json:"previous,omitempty"`
	PreviousFlushed string `msgpack:"previous_flushed,omitempty" json:"previous_flushed,omitempty"`
}

// OverlayRecoveredEvent: a repaired (and possibly grown) private copy of
// the overlay was renamed over it and its directory fsynced. Free figures
// are usable bytes (checked free minus reserved blocks).
type OverlayRecoveredEvent struct {
	Overlay    string `msgpack:"overlay" json:"overlay"`
	OldBytes   int64  `msgpack:"old_bytes" json:"old_bytes"`
	NewBytes   int64  `msgpack:"new_bytes" json:"new_bytes"`
	FreeBefore int64  `msgpack:"free_before" json:"free_before"`
	FreeAfter  int64  `msgpack:"free_after" json:"free_after"`
	Replayed   bool   `msgpack:"replayed,omitempty" json:"replayed,omitempty"`
}

// WarningRaisedEvent is an operator-facing warning (for example reason
// OverlayDiskFull).
type WarningRaisedEvent struct {
	Reason  string `msgpack:"reason" json:"reason"`
	Message string `msgpack:"message" json:"message"`
}

// ReapEntry is one resource as a reap run judged it: the `R` of
// `nexus reap --json`, with the path relative to the state root.
type ReapEntry struct {
	Kind      ResourceKind `msgpack:"kind" json:"kind"`
	Path      string       `msgpack:"path" json:"path"`
	Owner     string       `msgpack:"owner,omitempty" json:"owner,omitempty"`
	Verdict   string       `msgpack:"verdict" json:"verdict"`
	Reason    string       `msgpack:"reason" json:"reason"`
	Allocated int64        `msgpack:"allocated,omitempty" json:"allocated,omitempty"`
	Error     string       `msgpack:"error,omitempty" json:"error,omitempty"`
}

// ReapDecidedEvent records (part of) a reap plan: every verdict that was
// not "owned" (orphans, and what was kept live or ambiguous, with why).
// Owned resources are only counted; the journal already names them. A plan
// with many entries is split into parts so no event grows without bound.
type ReapDecidedEvent struct {
	Plan    string      `msgpack:"plan" json:"plan"`
	Apply   bool        `msgpack:"apply,omitempty" json:"apply,omitempty"`
	Part    int         `msgpack:"part" json:"part"`
	Parts   int         `msgpack:"parts" json:"parts"`
	Scanned int         `msgpack:"scanned" json:"scanned"`
	Owned   int         `msgpack:"owned" json:"owned"`
	Entries []ReapEntry `msgpack:"entries" json:"entries"`
}

// ReapAppliedEvent records what a `reap --apply` deleted (verified gone by
// a second stat) and what it failed to delete, per plan, in parts.
type ReapAppliedEvent struct {
	Plan    string      `msgpack:"plan" json:"plan"`
	Part    int         `msgpack:"part" json:"part"`
	Parts   int         `msgpack:"parts" json:"parts"`
	Deleted []ReapEntry `msgpack:"deleted" json:"deleted"`
	Failed  []ReapEntry `msgpack:"failed" json:"failed"`
}

// ResourceCreatedEvent: a resource other than a disk (a state directory,
// a record directory) exists and belongs to the sandbox.
type ResourceCreatedEvent struct {
	Resource Resource `msgpack:"resource" json:"resource"`
}

// ResourceReclaimedEvent: a resource was deleted and the delete verified.
type ResourceReclaimedEvent struct {
	Resource       Resource `msgpack:"resource" json:"resource"`
	By             string   `msgpack:"by" json:"by"` // rm, reap, recover, sweep
	AllocatedBytes int64    `msgpack:"allocated,omitempty" json:"allocated,omitempty"`
}

// RunSweptEvent is one sweep decision about a client run's ledger
// (<state-root>/runs/): the verdict, the rule behind it, and for a swept run
// what was removed and what was already gone.
type RunSweptEvent struct {
	RunID    string   `msgpack:"run" json:"run"`
	Verdict  string   `msgpack:"verdict" json:"verdict"`
	Reason   string   `msgpack:"reason" json:"reason"`
	Pid      int      `msgpack:"pid,omitempty" json:"pid,omitempty"`
	Driver   string   `msgpack:"driver,omitempty" json:"driver,omitempty"`
	By       string   `msgpack:"by" json:"by"` // "init" (init-time sweep), "watchdog", "cli"
	Removed  []string `msgpack:"removed,omitempty" json:"removed,omitempty"`
	NotFound []string `msgpack:"not_found,omitempty" json:"not_found,omitempty"`
	Networks []string `msgpack:"networks,omitempty" json:"networks,omitempty"`
}

// RunKeptEvent is every keep decision of one sweep (a swept run has its
// own run.swept): the runs the sweeper left alone, grouped by the rule
// that kept them. One event per sweep, not per run, so the happy path of a
// client's start costs one append however many runs are live.
type RunKeptEvent struct {
	By      string     `msgpack:"by" json:"by"`                               // "init" (a client's init-time sweep), "cli"
	Sweeper string     `msgpack:"sweeper,omitempty" json:"sweeper,omitempty"` // the sweeping process's own run, if it has one
	Driver  string     `msgpack:"driver" json:"driver"`                       // the sweeper's driver
	AtMs    int64      `msgpack:"at_ms" json:"at_ms"`                         // when the sweep decided, Unix ms
	Part    int        `msgpack:"part" json:"part"`                           // 1..Parts: a large sweep is split over events
	Parts   int        `msgpack:"parts" json:"parts"`
	Kept    []KeptRuns `msgpack:"kept" json:"kept"`
}

// KeptRuns are the runs one rule kept.
type KeptRuns struct {
	Reason string   `msgpack:"reason" json:"reason"`
	Runs   []string `msgpack:"runs" json:"runs"`
}

type ImageCachePreparedEvent struct {
	CacheID  string `msgpack:"cache_id" json:"cache_id"`
	Ref      string `msgpack:"ref" json:"ref"`
	Identity string `msgpack:"identity" json:"identity"`
	Layout   int    `msgpack:"layout" json:"layout"`
	Path     string `msgpack:"path" json:"path"`
}

type ImageCacheUsedEvent struct {
	CacheID   string `msgpack:"cache_id" json:"cache_id"`
	LastUseMs int64  `msgpack:"last_use_ms" json:"last_use_ms"`
}

type ImageCachePrunedEvent struct {
	CacheID        string `msgpack:"cache_id" json:"cache_id"`
	AllocatedBytes int64  `msgpack:"allocated" json:"allocated"`
}

// SagaStartedEvent opens a saga; every later event of the saga carries its id.
type SagaStartedEvent struct {
	Kind  SagaKind `msgpack:"kind" json:"kind"`
	Steps []string `msgpack:"steps" json:"steps"`
}

type SagaFinishedEvent struct{}

// HandleClaimedEvent: Sandbox took Handle. It is appended right after the
// event that gives the sandbox its handle (sandbox.created, .forked,
// .restored or .renamed), in the same atomic batch, on the handle's own
// subject (HandleSubject), expecting the last claim of the handle the
// decision saw: of two claims decided on the same state, the journal
// takes one. A handle is free again once its holder is removed or
// renamed; no event on the handle's subject releases it.
type HandleClaimedEvent struct {
	Sandbox string `msgpack:"sandbox" json:"sandbox"`
	Handle  string `msgpack:"handle" json:"handle"`
}

// SandboxRenamedEvent: the sandbox's handle is Handle now, no longer Old
// ("" for none). It is appended with the handle.claimed of Handle, as a
// sandbox.created is; Old is free from here on.
type SandboxRenamedEvent struct {
	Old    string `msgpack:"old,omitempty" json:"old,omitempty"`
	Handle string `msgpack:"handle" json:"handle"`
}

type SagaCompensatedEvent struct {
	Reason string `msgpack:"reason" json:"reason"`
}

func (SandboxCreatedEvent) EventType() Type     { return SandboxCreated }
func (SandboxForkedEvent) EventType() Type      { return SandboxForked }
func (SandboxRestoredEvent) EventType() Type    { return SandboxRestored }
func (SandboxStartedEvent) EventType() Type     { return SandboxStarted }
func (SandboxReadyEvent) EventType() Type       { return SandboxReady }
func (SandboxNotReadyEvent) EventType() Type    { return SandboxNotReady }
func (SandboxStoppedEvent) EventType() Type     { return SandboxStopped }
func (SandboxFailedEvent) EventType() Type      { return SandboxFailed }
func (SandboxRemovedEvent) EventType() Type     { return SandboxRemoved }
func (SandboxRenamedEvent) EventType() Type     { return SandboxRenamed }
func (DiskMaterialisedEvent) EventType() Type   { return DiskMaterialised }
func (IntentWrittenEvent) EventType() Type      { return IntentWritten }
func (IntentRetiredEvent) EventType() Type      { return IntentRetired }
func (SupervisorStartedEvent) EventType() Type  { return SupervisorStarted }
func (SupervisorStoppedEvent) EventType() Type  { return SupervisorStopped }
func (SupervisorExitedEvent) EventType() Type   { return SupervisorExited }
func (VMMExitedEvent) EventType() Type          { return VMMExited }
func (SnapshotTakenEvent) EventType() Type      { return SnapshotTaken }
func (VolumeCreatedEvent) EventType() Type      { return VolumeCreated }
func (VolumeAttachedEvent) EventType() Type     { return VolumeAttached }
func (VolumeDetachedEvent) EventType() Type     { return VolumeDetached }
func (VolumeRemovedEvent) EventType() Type      { return VolumeRemoved }
func (FlushAcknowledgedEvent) EventType() Type  { return FlushAcknowledged }
func (FlushPendingEvent) EventType() Type       { return FlushPending }
func (FlushRestoredEvent) EventType() Type      { return FlushRestored }
func (OverlayRecoveredEvent) EventType() Type   { return OverlayRecovered }
func (WarningRaisedEvent) EventType() Type      { return WarningRaised }
func (ReapDecidedEvent) EventType() Type        { return ReapDecided }
func (ReapAppliedEvent) EventType() Type        { return ReapApplied }
func (ResourceCreatedEvent) EventType() Type    { return ResourceCreated }
func (ResourceReclaimedEvent) EventType() Type  { return ResourceReclaimed }
func (RunSweptEvent) EventType() Type           { return RunSwept }
func (RunKeptEvent) EventType() Type            { return RunKept }
func (ImageCachePreparedEvent) EventType() Type { return ImageCachePrepared }
func (ImageCacheUsedEvent) EventType() Type     { return ImageCacheUsed }
func (ImageCachePrunedEvent) EventType() Type   { return ImageCachePruned }
func (SagaStartedEvent) EventType() Type        { return SagaStarted }
func (SagaFinishedEvent) EventType() Type       { return SagaFinished }
func (SagaCompensatedEvent) EventType() Type    { return SagaCompensated }
func (HandleClaimedEvent) EventType() Type      { return HandleClaimed }

// MirrorCreatedEvent: the daemon created this host's mirror stream on the
// fleet (the journal's audit copy) with these replicas.
type MirrorCreatedEvent struct {
	Stream   string `msgpack:"stream" json:"stream"`
	Domain   string `msgpack:"domain" json:"domain"`
	Replicas int    `msgpack:"replicas" json:"replicas"`
}

// MirrorRecreatedEvent: the mirror was gone from the fleet (deleted, or
// lost with a store's store) and the daemon created it again; the fleet
// copies the journal into it from sequence 1.
type MirrorRecreatedEvent struct {
	Stream   string `msgpack:"stream" json:"stream"`
	Domain   string `msgpack:"domain" json:"domain"`
	Replicas int    `msgpack:"replicas" json:"replicas"`
}

// MirrorLinkedEvent: the leaf link to the fleet came up. Flaps counts the
// link changes since the previous link event that were not journaled on
// their own (a flapping link is journaled at most once per 10 s).
type MirrorLinkedEvent struct {
	Stream string   `msgpack:"stream" json:"stream"`
	URLs   []string `msgpack:"urls" json:"urls"` // without passwords
	Flaps  int      `msgpack:"flaps,omitempty" json:"flaps,omitempty"`
}

// MirrorUnlinkedEvent: the leaf link to the fleet went down; appends go on
// and the mirror catches up when it is back. Flaps as in mirror.linked.
type MirrorUnlinkedEvent struct {
	Stream string   `msgpack:"stream" json:"stream"`
	URLs   []string `msgpack:"urls" json:"urls"` // without passwords
	Flaps  int      `msgpack:"flaps,omitempty" json:"flaps,omitempty"`
}

// MirrorSettingsDifferEvent: the mirror on the fleet has settings an
// operator changed (replicas, byte limit), which nexus keeps; Kept says
// which. Journaled when the difference changes.
type MirrorSettingsDifferEvent struct {
	Stream string `msgpack:"stream" json:"stream"`
	Kept   string `msgpack:"kept" json:"kept"`
}

// MirrorRefusedEvent: the mirror's stream on the fleet belongs to another
// host identity (or none), so this host stopped mirroring into it.
type MirrorRefusedEvent struct {
	Stream string `msgpack:"stream" json:"stream"`
	Reason string `msgpack:"reason" json:"reason"`
}

func (MirrorCreatedEvent) EventType() Type        { return MirrorCreated }
func (MirrorRecreatedEvent) EventType() Type      { return MirrorRecreated }
func (MirrorLinkedEvent) EventType() Type         { return MirrorLinked }
func (MirrorUnlinkedEvent) EventType() Type       { return MirrorUnlinked }
func (MirrorSettingsDifferEvent) EventType() Type { return MirrorSettingsDiffer }
func (MirrorRefusedEvent) EventType() Type        { return MirrorRefused }
