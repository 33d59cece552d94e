package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "config.toml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return root
}

// clearEnv unsets every variable Settings reads, so the host's own
// settings do not leak into what a case expects.
func clearEnv(t *testing.T) {
	for _, v := range []string{"NEXUS_CONFIG", "NEXUS_STATE_DIR", "XDG_STATE_HOME", "NEXUS_DRIVER", "NEXUS_KERNEL_PATH",
		"NEXUS_INITRAMFS_PATH", "NEXUS_KERNEL_CMDLINE", "NEXUS_VM_ROOT", "NEXUS_CH_BINARY", "NEXUS_QEMU_BINARY",
		"NEXUS_QEMU_ACCEL", "NEXUS_DAEMON_IDLE", "NEXUS_NO_AUTO_DAEMON", "NEXUS_LOG_LEVEL"} {
		t.Setenv(v, "")
	}
}

func TestLoadRefusesAnUnknownDriver(t *testing.T) {
	clearEnv(t)
	_, _, err := Load(writeConfig(t, "[vm]\ndriver = \"kvm\"\n"))
	if err == nil || !strings.Contains(err.Error(), `[vm] driver = "kvm": want cloud-hypervisor, process or qemu`) {
		t.Fatalf("[vm] driver = kvm: %v", err)
	}
	if _, _, err := Load(writeConfig(t, "[vm]\ndriver = \"qemu\"\n")); err != nil {
		t.Fatalf("[vm] driver = qemu: %v", err)
	}
}

func TestDriverDefaults(t *testing.T) {
	var f File
	if got := f.DriverName(""); got != "cloud-hypervisor" {
		t.Errorf("no driver asked or set: %q", got)
	}
	f.VM.Driver = "qemu"
	if got, asked := f.DriverName(""), f.DriverName("process"); got != "qemu" || asked != "process" {
		t.Errorf("[vm] driver = qemu: %q, asked process: %q", got, asked)
	}
	if got := Driver(""); got != "cloud-hypervisor" {
		t.Errorf("Driver(\"\") = %q", got)
	}
}

// Settings names each setting's source: the flag, the environment, the
// file, else the default.
func TestSettingsNameTheirSources(t *testing.T) {
	clearEnv(t)
	root := writeConfig(t, "[vm]\ndriver = \"qemu\"\ncpus = 2\nkernel = \"/boot/k\"\n")
	file := filepath.Join(root, "config.toml")
	t.Setenv("NEXUS_LOG_LEVEL", "debug")
	t.Setenv("NEXUS_KERNEL_PATH", "/env/k")
	get := func(asked Asked) map[string]Setting {
		list, err := Settings(root, asked)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]Setting{}
		for _, s := range list {
			got[s.Name] = s
		}
		return got
	}
	got := get(Asked{DaemonIdle: "30s"})
	for name, want := range map[string]Setting{
		"state_dir":   {Name: "state_dir", Value: root, Source: "default"},
		"driver":      {Name: "driver", Value: "qemu", Source: "file " + file},
		"config_file": {Name: "config_file", Value: file, Source: "default"},
		"vm.cpus":     {Name: "vm.cpus", Value: "2", Source: "file " + file},
		"vm.kernel":   {Name: "vm.kernel", Value: "/env/k", Source: "env NEXUS_KERNEL_PATH"},
		"vm.memory":   {Name: "vm.memory", Value: "512 MiB", Source: "default"},
		"log_level":   {Name: "log_level", Value: "debug", Source: "env NEXUS_LOG_LEVEL"},
		"daemon_idle": {Name: "daemon_idle", Value: "30s", Source: "default"},
	} {
		if got[name] != want {
			t.Errorf("%s: got %+v, want %+v", name, got[name], want)
		}
	}
	process := "process"
	got = get(Asked{StateDirFlag: true, DriverFlag: &process})
	if s := got["driver"]; s != (Setting{Name: "driver", Value: "process", Source: "flag --driver"}) {
		t.Errorf("--driver process: %+v", s)
	}
	if s := got["state_dir"]; s.Source != "flag --state-dir" {
		t.Errorf("--state-dir: %+v", s)
	}
}
