// Package vmm speaks the subset of Cloud Hypervisor's REST API that nexus
// uses, over CH's unix API socket, from both ends: Client drives a real CH or
// the process driver, and Serve is the process driver's stand-in VMM, for
// hosts where CH cannot run. Field names and status codes follow CH's OpenAPI
// document so that code exercised against Serve behaves the same against CH.
package vmm

// Paths under CH's API root.
const (
	pathPing        = "/api/v1/vmm.ping"
	pathShutdownVMM = "/api/v1/vmm.shutdown"
	pathCreate      = "/api/v1/vm.create"
	pathBoot        = "/api/v1/vm.boot"
	pathShutdown    = "/api/v1/vm.shutdown"
	pathDelete      = "/api/v1/vm.delete"
	pathInfo        = "/api/v1/vm.info"
	pathPause       = "/api/v1/vm.pause"
	pathResume      = "/api/v1/vm.resume"
	pathSnapshot    = "/api/v1/vm.snapshot"
	pathRestore     = "/api/v1/vm.restore"
)

// Version is what the process driver answers to vmm.ping, so a caller can
// tell it from a real CH (which answers e.g. "v43.0").
const Version = "nexus-process-vmm"

// Config is the subset of CH's VmConfig that nexus sets. Unknown fields in a
// request are ignored, as CH's serde does for optional ones.
type Config struct {
	Payload Payload `json:"payload"`
	Disks   []Disk  `json:"disks,omitempty"`
	Memory  Memory  `json:"memory,omitzero"`
	Cpus    Cpus    `json:"cpus,omitzero"`
	Vsock   *Vsock  `json:"vsock,omitempty"`
}

// Payload is CH's PayloadConfig.
type Payload struct {
	Kernel    string `json:"kernel,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
	Firmware  string `json:"firmware,omitempty"`
}

// Disk is CH's DiskConfig.
type Disk struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

// Memory is CH's MemoryConfig; Size is in bytes.
type Memory struct {
	Size int64 `json:"size"`
}

// Cpus is CH's CpusConfig. CH sets MaxVcpus to BootVcpus when absent.
type Cpus struct {
	BootVcpus int `json:"boot_vcpus"`
	MaxVcpus  int `json:"max_vcpus,omitempty"`
}

// Vsock is CH's VsockConfig: Socket is the host-side unix socket CH proxies
// guest vsock connections through.
type Vsock struct {
	Cid    int64  `json:"cid"`
	Socket string `json:"socket"`
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

type pingResponse struct {
	Version string `json:"version"`
	Pid     int    `json:"pid,omitempty"`
}

type snapshotRequest struct {
	DestinationURL string `json:"destination_url"`
}

type restoreRequest struct {
	SourceURL string `json:"source_url"`
	Prefault  bool   `json:"prefault,omitempty"`
}

// Snapshot files: CH names its VM configuration and device state the same
// (and adds memory-ranges, which the stand-in has no memory to fill).
const (
	snapshotConfigFile = "config.json"
	snapshotStateFile  = "state.json"
)

type snapshotState struct {
	State   State  `json:"state"`
	TakenAt string `json:"taken_at"`
}
