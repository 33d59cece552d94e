package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `make install` puts what a system looks for where it looks: the
// binaries, a man page per command that man(1) finds, and the shell
// completions, and systemd units that systemd-analyze accepts.
// (install-files is install without the build.)
func TestMakeInstallLaysOutATool(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"make", "man", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (make setup-test installs it): %v", tool, err)
		}
	}
	prefix := filepath.Join(t.TempDir(), "usr")
	agent := filepath.Join(t.TempDir(), "nexus-agent")
	os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755)
	cmd := exec.Command("make", "-C", "../..", "install-files", "PREFIX="+prefix, "BIN="+nexusBin, "DAEMON="+daemonOf(nexusBin), "FLEET="+filepath.Join(filepath.Dir(nexusBin), "nexus-fleet"), "SHIM="+filepath.Join(filepath.Dir(nexusBin), "nexus-shim"), "AGENT="+agent)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install-files: %v\n%s", err, out)
	}
	for _, f := range []string{"bin/nexus", "bin/nexusd", "bin/nexus-fleet", "bin/nexus-shim", "bin/nexus-agent", "share/man/man1/nexus.1", "share/man/man1/nexus-create.1",
		"lib/systemd/system/nexus.socket", "lib/systemd/system/nexus.service",
		"share/bash-completion/completions/nexus", "share/zsh/site-functions/_nexus", "share/fish/vendor_completions.d/nexus.fish"} {
		if st, err := os.Stat(filepath.Join(prefix, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	out, err := exec.Command("man", "-M", filepath.Join(prefix, "share", "man"), "-P", "cat", "nexus-create").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nexus create --image IMG") {
		t.Fatalf("man -M PREFIX/share/man nexus-create: %v\n%s", err, out)
	}
	units := filepath.Join(prefix, "lib", "systemd", "system")
	service, err := os.ReadFile(filepath.Join(units, "nexus.service"))
	if err != nil || !strings.Contains(string(service), "ExecStart="+filepath.Join(prefix, "bin", "nexus")+" ") {
		t.Fatalf("nexus.service does not start the installed binary: %v\n%s", err, service)
	}
	// verify loads each unit, checks its executables and runs man(1) for
	// its Documentation= pages.
	verify := exec.Command("systemd-analyze", "verify", filepath.Join(units, "nexus.socket"), filepath.Join(units, "nexus.service"))
	verify.Env = append(os.Environ(), "MANPATH="+filepath.Join(prefix, "share", "man"))
	if out, err := verify.CombinedOutput(); err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
