// Package vmm speaks the subset of Cloud Hypervisor's REST API that nexus
// uses, over CH's unix API socket: its types and operations, Client (which
// drives a real CH and both drivers' VMMs), the scaffolding every VMM that
// serves the subset shares (apiserver.go), the guest agent's vsock
// handshake and the snapshot config.json edit a restore makes. Field names
// and status codes follow CH's OpenAPI document; the process driver's
// stand-in VMM is host/vmm/standin.
package vmm

// Operations of CH's API: each is the path of its call below APIRoot.
const (
	OpPing        = "vmm.ping"
	OpShutdownVMM = "vmm.shutdown"
	OpCreate      = "vm.create"
	OpBoot        = "vm.boot"
	OpShutdown    = "vm.shutdown"
	OpDelete      = "vm.delete"
	OpInfo        = "vm.info"
	OpPause       = "vm.pause"
	OpResume      = "vm.resume"
	OpSnapshot    = "vm.snapshot"
	OpRestore     = "vm.restore"
)

// Config is the subset of CH's VmConfig that nexus sets. CH ignores fields
// it does not know (no config uses deny_unknown_fields), and gives an
// absent optional one its default. It is for
// building vm.create bodies and reading vm.info: a configuration CH wrote
// (a snapshot's config.json) carries many more fields, and is edited as
// generic JSON (EditSnapshotConfig), never round-tripped through Config.
type Config struct {
	Payload Payload  `json:"payload"`
	Disks   []Disk   `json:"disks,omitempty"`
	Memory  Memory   `json:"memory,omitzero"`
	Cpus    Cpus     `json:"cpus,omitzero"`
	Vsock   *Vsock   `json:"vsock,omitempty"`
	Serial  *Console `json:"serial,omitempty"`
	// Console is the virtio-console. CH's default is Tty: the VMM's own
	// terminal, which a daemon-started VMM does not have, and a second
	// console the guest would probe for nothing.
	Console *Console `json:"console,omitempty"`
}

// Payload is CH's PayloadConfig.
type Payload struct {
	Kernel    string `json:"kernel,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
	Firmware  string `json:"firmware,omitempty"`
}

// Disk is CH's DiskConfig. ID is CH's device id: CH names a disk without
// one "_disk<n>" at boot and keeps the name in its configuration, and a
// restore matches saved device state by it. Serial is the virtio-blk serial
// the guest reads (/sys/block/<dev>/serial); CH v47+ refuses one longer
// than SerialMax bytes, and a guest never sees more than that.
type Disk struct {
	Path      string    `json:"path"`
	Readonly  bool      `json:"readonly"`
	ImageType ImageType `json:"image_type,omitempty"`
	ID        string    `json:"id,omitempty"`
	// Serial is the virtio-blk serial the guest reads from
	// /sys/block/<dev>/serial (agentproto.DiskSerial).
	Serial string `json:"serial,omitempty"`
}

// SerialMax is VIRTIO_BLK_ID_BYTES, the longest serial CH accepts.
const SerialMax = 20

// ImageType is CH's ImageType (OpenAPI enum FixedVhd, Qcow2, Raw, Vhdx,
// Unknown). From v51 CH auto-detects the type of a disk sent without one
// and, when it detects Raw or FixedVhd, refuses every write to sector 0
// (VIRTIO_BLK_S_IOERR); a disk sent with its type is not restricted. Older
// versions ignore the field (no CH config uses deny_unknown_fields).
type ImageType string

const (
	ImageRaw      ImageType = "Raw"
	ImageQcow2    ImageType = "Qcow2"
	ImageVhdx     ImageType = "Vhdx"
	ImageFixedVhd ImageType = "FixedVhd"
	ImageUnknown  ImageType = "Unknown"
)

// Console is CH's SerialConfig/ConsoleConfig. CH's serial port defaults to
// Null: a guest kernel logging to ttyS0 loses every line unless serial is
// configured, for nexus as a File.
type Console struct {
	Mode ConsoleMode `json:"mode"`
	File string      `json:"file,omitempty"`
}

// ConsoleMode is CH's ConsoleMode (Off, Pty, Tty, File, Socket, Null).
type ConsoleMode string

const (
	ConsoleFile ConsoleMode = "File"
	ConsoleNull ConsoleMode = "Null"
	ConsoleOff  ConsoleMode = "Off"
	ConsoleTty  ConsoleMode = "Tty"
)

// Memory is CH's MemoryConfig; Size is in bytes. As with Cpus, a memory
// object without size does not deserialize (vm.create answers 400); a
// body without memory gets CH's 512 MiB.
type Memory struct {
	Size int64 `json:"size"`
}

// Cpus is CH's CpusConfig. Neither count has a serde default
// (vm_config.rs at v53.0): a cpus object missing boot_vcpus or max_vcpus
// does not deserialize, and vm.create answers 400; only a body without
// cpus at all gets CH's default, 1 and 1. Whether the counts make sense
// (max_vcpus >= boot_vcpus) is validated later, at vm.boot.
type Cpus struct {
	BootVcpus int `json:"boot_vcpus"`
	MaxVcpus  int `json:"max_vcpus"`
}

// Vsock is CH's VsockConfig: Socket is the host-side unix socket CH proxies
// guest vsock connections through.
type Vsock struct {
	Cid    int64  `json:"cid"`
	Socket string `json:"socket"`
	ID     string `json:"id,omitempty"`
}

// State is CH's VmState.
type State string

const (
	StateCreated  State = "Created"
	StateRunning  State = "Running"
	StatePaused   State = "Paused"
	StateShutdown State = "Shutdown"
)

// Info is CH's VmInfo, as answered by vm.info.
type Info struct {
	State  State  `json:"state"`
	Config Config `json:"config"`
}

// PingResponse is CH's VmmPingResponse.
type PingResponse struct {
	Version string `json:"version"`
	Pid     int    `json:"pid,omitempty"`
}

// SnapshotRequest is CH's VmSnapshotConfig.
type SnapshotRequest struct {
	DestinationURL string `json:"destination_url"`
}

// RestoreRequest is CH's RestoreConfig.
type RestoreRequest struct {
	SourceURL string `json:"source_url"`
	Prefault  bool   `json:"prefault,omitempty"`
}

// Snapshot files as CH names them (vmm/src/migration/mod.rs,
// vmm/src/memory_manager.rs): vm.snapshot creates all three exclusively in
// an existing directory, and vm.restore reads all three from source_url.
const (
	SnapshotConfigFile = "config.json"
	SnapshotStateFile  = "state.json"
	SnapshotMemoryFile = "memory-ranges"
)
