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
	var noAgent bool
	build := &cobra.Command{
		Use:   "initramfs --kernel-release R -o FILE [--init PATH] [--agent PATH | --no-agent]",
		Short: "Build a guest initramfs: the kernel's virtio modules (from /lib/modules/R/modules.dep), a static /init and the guest agent",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if release == "" || strings.ContainsRune(release, '/') {
				return usageError{fmt.Errorf("--kernel-release %q: want a release such as 6.1.0-27-cloud-amd64", release)}
			}
			if o.ModulesDir == "" {
				o.ModulesDir = filepath.Join("/lib/modules", release)
			}
			if o.Init == "" {
				if o.Init = findBeside("nexus-init"); o.Init == "" {
					return errors.New("no nexus-init beside nexus or in PATH: pass --init PATH (build one with CGO_ENABLED=0 go build ./cmd/nexus-init)")
				}
			}
			if o.Agent == "" && !noAgent {
				o.Agent = findBeside("nexus-agent")
			}
			o.Wanted, o.Optional = initramfs.Wanted, initramfs.Optional
			res, err := initramfs.Build(o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%s: /init from %s, %d modules\n", o.Out, o.Init, len(res.Modules))
			if o.Agent != "" {
				fmt.Fprintf(out, "/%s from %s (started by /init on the virtio-serial port)\n", initramfs.AgentPath, o.Agent)
			} else {
				fmt.Fprintln(out, "no guest agent: /init answers only ping, and a stop is never flush-acknowledged")
			}
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
	build.Flags().StringVar(&o.Init, "init", "", "static binary to run as /init (default: nexus-init beside nexus, else in PATH)")
	build.Flags().StringVar(&o.Agent, "agent", "", "static guest agent, put at /sbin/nexus-agent for /init to start (default: nexus-agent beside nexus, else in PATH, if any)")
	build.Flags().BoolVar(&noAgent, "no-agent", false, "leave the guest agent out")
	build.Flags().StringVar(&o.ModulesDir, "modules-dir", "", "modules directory (default /lib/modules/R)")
	requireFlags(build, "kernel-release", "output")
	c.AddCommand(build)
	return c
}

// findBeside looks for a guest binary beside this executable, then in
// PATH ("" when neither has it).
func findBeside(name string) string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return ""
}
