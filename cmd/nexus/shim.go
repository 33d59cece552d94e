package main

import (
	"os"
	"path/filepath"
)

// ShimEnv names the nexus-shim binary used instead of the one beside this
// executable.
const ShimEnv = "NEXUS_SHIM"

// shimBinary is nexus-shim (cmd/nexus-shim), which the sandboxes'
// supervisors and the process and qemu drivers' VMMs run from:
// $NEXUS_SHIM, else beside this executable, as nexus, nexusd and it are
// installed. It is not looked for here: a command that starts none of
// those processes does not need it, and one that does names its path when
// the spawn fails.
func shimBinary() (string, error) {
	if p := os.Getenv(ShimEnv); p != "" {
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(exe), "nexus-shim"), nil
}
