//go:build nexusd

package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/host/initramfs"
)

// buildInitramfs writes the guest initramfs f names for kernel release.
func buildInitramfs(cmd *cobra.Command, release string, f initramfsFlags) error {
	o := initramfs.Options{Out: f.out, Init: f.init, ModulesDir: f.modulesDir}
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
}
