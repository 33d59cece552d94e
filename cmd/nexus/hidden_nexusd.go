//go:build nexusd

package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/host/driver"
	hostproc "github.com/nexus-sandbox/nexus/host/proc" // proc is a test helper's name in this package
	"github.com/nexus-sandbox/nexus/host/qemu"
	"github.com/nexus-sandbox/nexus/host/supervisor"
	"github.com/nexus-sandbox/nexus/host/vmm/standin"
)

// The sandboxes' processes are spawned from nexus-shim (cmd/nexus-shim);
// nexusd serves the same command lines, for a process started by hand.
func shimCmds() []*cobra.Command {
	return []*cobra.Command{supervisorCmd(), vmmProcessCmd(), vmmQEMUCmd()}
}

// vmmProcessCmd is the process driver's VMM: a host process serving the
// Cloud Hypervisor API subset on the sandbox's API socket, on the driver's
// command line (host/driver names the command and flags); it also stands
// in for cloud-hypervisor in the driver's tests.
func vmmProcessCmd() *cobra.Command {
	var api string
	c := &cobra.Command{
		Use: driver.ProcessCommand + " --" + driver.APISocketFlag + " PATH", Hidden: true, Args: noArgs,
		Short: "Serve the Cloud Hypervisor API subset as a plain process (process driver)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return standin.Serve(cmd.Context(), api, os.Stderr, hostproc.ReadyHook())
		},
	}
	c.Flags().StringVar(&api, driver.APISocketFlag, "", "API socket path (required)")
	requireFlags(c, driver.APISocketFlag)
	return c
}

// vmmQEMUCmd is the qemu driver's VMM: nexus's adapter serving the Cloud
// Hypervisor API subset and running QEMU underneath (host/qemu).
func vmmQEMUCmd() *cobra.Command {
	var api string
	o := qemu.Options{Log: os.Stderr}
	c := &cobra.Command{
		Use: driver.QEMUCommand + " --" + driver.APISocketFlag + " PATH", Hidden: true, Args: noArgs,
		Short: "Serve the Cloud Hypervisor API subset over QEMU (qemu driver)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Accel != "" && o.Accel != "kvm" && o.Accel != "tcg" {
				return usageError{fmt.Errorf("--accel %q: want kvm or tcg", o.Accel)}
			}
			o.Ready = hostproc.ReadyHook()
			return qemu.Serve(cmd.Context(), api, o)
		},
	}
	c.Flags().StringVar(&api, driver.APISocketFlag, "", "API socket path (required)")
	c.Flags().StringVar(&o.Binary, driver.QEMUBinaryFlag, driver.DefaultQEMUBinary, "QEMU binary")
	c.Flags().StringVar(&o.Accel, "accel", os.Getenv("NEXUS_QEMU_ACCEL"), "kvm or tcg (env NEXUS_QEMU_ACCEL; default kvm when /dev/kvm answers)")
	requireFlags(c, driver.APISocketFlag)
	return c
}

// supervisorCmd is a sandbox's perimeter supervisor, spawned detached.
func supervisorCmd() *cobra.Command {
	var o supervisor.ServeOptions
	c := &cobra.Command{
		Use: supervisor.Command + " --" + supervisor.SandboxFlag + " ID --" + supervisor.StateDirFlag + " DIR --" + supervisor.IIDSocketFlag + " PATH", Hidden: true, Args: noArgs,
		Short: "Run a sandbox's perimeter supervisor",
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Now, o.Log, o.Ready = time.Now, os.Stderr, hostproc.ReadyHook()
			return supervisor.Serve(cmd.Context(), o)
		},
	}
	c.Flags().StringVar(&o.SandboxID, supervisor.SandboxFlag, "", "sandbox ULID (required)")
	c.Flags().StringVar(&o.StateDir, supervisor.StateDirFlag, "", "supervisors/<ULID> directory (required)")
	c.Flags().StringVar(&o.IIDSocket, supervisor.IIDSocketFlag, "", "instance-identity socket path (required)")
	c.Flags().StringVar(&o.ConsoleLog, supervisor.ConsoleLogFlag, "", "console log whose time index to keep")
	c.Flags().StringVar(&o.ConsoleIndex, supervisor.ConsoleIndexFlag, "", "the console log's time index")
	requireFlags(c, supervisor.SandboxFlag, supervisor.StateDirFlag, supervisor.IIDSocketFlag)
	return c
}
