package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/host/initramfs"
)

func guestCmd() *cobra.Command {
	c := &cobra.Command{Use: "guest", Short: "Build what a real guest boots with"}
	var o initramfs.Options
	var release string
	build := &cobra.Command{
		Use:   "initramfs --kernel-release R -o FILE [--agent PATH]",
		Short: "Build a guest initramfs: the kernel's virtio modules (from /lib/modules/R/modules.dep) and a static /init",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if release == "" || strings.ContainsRune(release, '/') {
				return usageError{fmt.Errorf("--kernel-release %q: want a release such as 6.1.0-27-cloud-amd64", release)}
			}
			if o.ModulesDir == "" {
				o.ModulesDir = filepath.Join("/lib/modules", release)
			}
			if o.Init == "" {
				var err error
				if o.Init, err = findInit(); err != nil {
					return err
				}
			}
			o.Wanted, o.Optional = initramfs.Wanted, initramfs.Optional
			res, err := initramfs.Build(o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%s: /init from %s, %d modules\n", o.Out, o.Init, len(res.Modules))
			for _, m := range res.Modules {
				fmt.Fprintf(out, "  %s\n", m)
			}
			if len(res.Builtin) > 0 {
				fmt.Fprintf(out, "built into the kernel: %s\n", strings.Join(res.Builtin, ", "))
			}
			if len(res.Missing) > 0 {
				fmt.Fprintf(out, "not in this kernel (optional): %s\n", strings.Join(res.Missing, ", "))
			}
			return nil
		},
	}
	build.Flags().StringVar(&release, "kernel-release", "", "kernel release whose modules to take, as under /lib/modules (required)")
	build.Flags().StringVarP(&o.Out, "output", "o", "", "archive to write (required)")
	build.Flags().StringVar(&o.Init, "agent", "", "static binary to run as /init (default: nexus-agent, else nexus-init, beside nexus or in PATH)")
	build.Flags().StringVar(&o.ModulesDir, "modules-dir", "", "modules directory (default /lib/modules/R)")
	requireFlags(build, "kernel-release", "output")
	c.AddCommand(build)
	return c
}

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
