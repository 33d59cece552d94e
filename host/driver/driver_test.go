package driver

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestMain lets this test binary stand in for any driver's VMM: started
// with a VMM's command line it waits for its stdin to close.
func TestMain(m *testing.M) {
	for _, a := range os.Args[1:min(3, len(os.Args))] {
		if a == "--"+APISocketFlag {
			io.Copy(io.Discard, os.Stdin)
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

func TestArgv(t *testing.T) {
	for _, c := range []struct {
		d    Driver
		want []string
	}{
		{Driver{Name: CloudHypervisor}, []string{"cloud-hypervisor", "--api-socket", "/r/a.sock"}},
		{Driver{Name: CloudHypervisor, CHBinary: "/opt/ch"}, []string{"/opt/ch", "--api-socket", "/r/a.sock"}},
		{Driver{Name: Process, Exe: "/bin/nexus"}, []string{"/bin/nexus", "vmm-process", "--api-socket", "/r/a.sock"}},
		{Driver{Name: QEMU, Exe: "/bin/nexus"}, []string{"/bin/nexus", "vmm-qemu", "--api-socket", "/r/a.sock", "--qemu", "qemu-system-x86_64"}},
		{Driver{Name: QEMU, Exe: "/bin/nexus", QEMU: "/opt/q"}, []string{"/bin/nexus", "vmm-qemu", "--api-socket", "/r/a.sock", "--qemu", "/opt/q"}},
	} {
		if got := c.d.Argv("/r/a.sock"); !slices.Equal(got, c.want) {
			t.Errorf("%+v: Argv = %q, want %q", c.d, got, c.want)
		}
	}
}

// Each driver's VMM, started with the driver's own command line, is found
// by its API socket, and only by its own socket.
func TestVMMsFindsEachDriversVMM(t *testing.T) {
	dir := t.TempDir()
	for i, name := range Names {
		api := filepath.Join(dir, fmt.Sprintf("sb-%d.sock", i))
		d := Driver{Name: name, Exe: os.Args[0], CHBinary: os.Args[0]}
		argv := d.Argv(api)
		cmd := exec.Command(argv[0], argv[1:]...)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); cmd.Wait() })
		if got := VMMs(api); !slices.Equal(got, []int{cmd.Process.Pid}) {
			t.Errorf("%s: VMMs(%s) = %v, want [%d]", name, api, got, cmd.Process.Pid)
		}
		if got := VMMs(api + ".other"); len(got) != 0 {
			t.Errorf("%s: VMMs of another socket = %v", name, got)
		}
	}
}

func TestKnown(t *testing.T) {
	for _, n := range Names {
		if !Known(n) {
			t.Errorf("Known(%q) = false", n)
		}
	}
	if Known("") || Known("firecracker") {
		t.Error("Known accepts a name that is no driver")
	}
}
