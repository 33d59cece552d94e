package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spf13/cobra"
)

func guestCmd() *cobra.Command {
	c := &cobra.Command{Use: "guest", Short: "Build what a real guest boots with"}
	var o initramfsFlags
	var release string
	build := &cobra.Command{
		Use:   "initramfs --kernel-release R -o FILE [--agent PATH]",
		Short: "Build a guest initramfs: the kernel's virtio modules (from /lib/modules/R/modules.dep) and a static /init",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return buildInitramfs(cmd, release, o)
		},
	}
	build.Flags().StringVar(&release, "kernel-release", "", "kernel release whose modules to take, as under /lib/modules (required)")
	build.Flags().StringVarP(&o.out, "output", "o", "", "archive to write (required)")
	build.Flags().StringVar(&o.init, "agent", "", "static binary to run as /init (default: nexus-agent, else nexus-init, beside nexus or in PATH)")
	build.Flags().StringVar(&o.modulesDir, "modules-dir", "", "modules directory (default /lib/modules/R)")
	requireFlags(build, "kernel-release", "output")
	c.AddCommand(build)
	return c
}

// initramfsFlags are guest initramfs's paths, as given.
type initramfsFlags struct{ out, init, modulesDir string }

// findInit looks for the guest's /init beside this executable, then in
// PATH: the agent first, the minimal init while there is no agent.
func findInit() (string, error) {
	exe, _ := os.Executable()
	for _, name := range []string{"nexus-agent", "nexus-init"} {
		if exe != "" {
			p := filepath.Join(filepath.Dir(exe), name)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				return p, nil
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no nexus-agent or nexus-init beside nexus or in PATH: pass --agent PATH (build one with CGO_ENABLED=0 go build ./cmd/nexus-init)")
}
