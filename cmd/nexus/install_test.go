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
// completions. (install-files is install without the build.)
func TestMakeInstallLaysOutATool(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"make", "man"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (make setup-test installs it): %v", tool, err)
		}
	}
	prefix := filepath.Join(t.TempDir(), "usr")
	agent := filepath.Join(t.TempDir(), "nexus-agent")
	os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755)
	cmd := exec.Command("make", "-C", "../..", "install-files", "PREFIX="+prefix, "BIN="+nexusBin, "DAEMON="+daemonOf(nexusBin), "AGENT="+agent)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install-files: %v\n%s", err, out)
	}
	for _, f := range []string{"bin/nexus", "bin/nexusd", "bin/nexus-agent", "share/man/man1/nexus.1", "share/man/man1/nexus-create.1",
		"share/bash-completion/completions/nexus", "share/zsh/site-functions/_nexus", "share/fish/vendor_completions.d/nexus.fish"} {
		if st, err := os.Stat(filepath.Join(prefix, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	out, err := exec.Command("man", "-M", filepath.Join(prefix, "share", "man"), "-P", "cat", "nexus-create").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nexus create --image IMG") {
		t.Fatalf("man -M PREFIX/share/man nexus-create: %v\n%s", err, out)
	}
}
