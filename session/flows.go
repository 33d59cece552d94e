package session

import (
	"context"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/projections"
)

// The flows a command runs, as cmd/nexus reaches them: the manager, what
// each flow takes and returns, and the limits a command checks at parse
// time. They are lifecycle's; a command names them only here, so what the
// CLI depends on of the flows is this list.
type (
	Manager           = lifecycle.Manager
	Hook              = lifecycle.Hook
	Progress          = lifecycle.Progress
	Already           = lifecycle.Already
	CreateSpec        = lifecycle.CreateSpec
	Shadow            = lifecycle.Shadow
	Mount             = lifecycle.Mount
	ForkSpec          = lifecycle.ForkSpec
	StartOptions      = lifecycle.StartOptions
	RemoveOptions     = lifecycle.RemoveOptions
	Removed           = lifecycle.Removed
	SnapshotOptions   = lifecycle.SnapshotOptions
	SnapshotInfo      = lifecycle.SnapshotInfo
	RestoreOptions    = lifecycle.RestoreOptions
	LogOptions        = lifecycle.LogOptions
	PruneReport       = lifecycle.PruneReport
	CacheListing      = lifecycle.CacheListing
	CachePruneOptions = lifecycle.CachePruneOptions
	ExecOptions       = lifecycle.ExecOptions
	ExecStartError    = lifecycle.ExecStartError
	ReapOptions       = lifecycle.ReapOptions
	ReapReport        = lifecycle.ReapReport
	ReapItem          = lifecycle.ReapItem
)

const (
	DefaultFlushDeadline = lifecycle.DefaultFlushDeadline
	DefaultReadyTimeout  = lifecycle.DefaultReadyTimeout
	HostGuestNotice      = lifecycle.HostGuestNotice
)

// LogKinds are the logs `nexus logs --log` reads.
func LogKinds() []string { return lifecycle.LogKinds }

// ShimCommands are the commands nexus-shim serves, which the CLI hands on.
func ShimCommands() []string { return lifecycle.ShimCommands }

// Lookup is the sandbox ref names (ID, handle, short ID or unique prefix).
func Lookup(ctx context.Context, b control.Backend, ref string) (projections.Sandbox, error) {
	return lifecycle.Lookup(ctx, b, ref)
}

// ObserveExits is list with each sandbox whose VMM ended on its own shown
// as exited.
func ObserveExits(list []projections.Sandbox) []projections.Sandbox {
	return lifecycle.ObserveExits(list)
}

// CheckForkCount refuses a fork count out of range.
func CheckForkCount(n int) error { return lifecycle.CheckForkCount(n) }

// ChildHandles are the handles of count fork children named by template.
func ChildHandles(template string, count int) ([]string, error) {
	return lifecycle.ChildHandles(template, count)
}

// Settings are what a command's flows are built with besides the backend.
type Settings struct {
	Root string
	// Driver is the driver's name; Shim the binary its processes run from.
	Driver, Shim string
	// AskedDriver is the driver the command was asked for ("": none).
	AskedDriver string
	// Config gives the defaults a new sandbox is made with.
	Config   config.File
	Hook     Hook
	Wait     bool
	Progress Progress
	// Notice tells the person a warning; Status what a flow is doing.
	Notice, Status func(string)
}

// NewManager is the manager of a command's flows over b: real processes,
// s's driver, and the defaults of s.Config.
func NewManager(b control.Backend, s Settings) (*Manager, error) {
	return s.Config.Manager(lifecycle.Manager{
		Root: layout.Root(s.Root), B: b, Driver: driver.Driver{Name: s.Driver, Exe: s.Shim},
		AskedDriver: s.AskedDriver, Hook: s.Hook, Wait: s.Wait, Progress: s.Progress,
		Notice: s.Notice, Status: s.Status,
	})
}
