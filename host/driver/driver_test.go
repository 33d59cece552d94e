package driver

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/internal/testutil"
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
		// exec's success reaches the parent a moment before the kernel
		// has the new command line in place: wait for it to be readable.
		testutil.WaitUntil(t, 10*time.Second, name+"'s command line", func() bool {
			args, err := proc.Args(cmd.Process.Pid)
			return err == nil && slices.Equal(args, argv)
		})
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

// Cloud Hypervisor binds its API socket by name, and reads --api-socket
// as path=/fd= options unless that parse fails, as it does for an
// absolute path.
func TestCHAPISocket(t *testing.T) {
	long := "/" + strings.Repeat("d", 60) + "/run/sb-01KAAAAAAAAAAAAAAAAAAAAAA1.sock"
	for _, c := range []struct {
		path, refusal string
	}{
		{"/var/lib/nexus/run/sb-01KAAAAAAAAAAAAAAAAAAAAAA1.sock", ""},
		{"/tmp/a,b=c/run/sb-01KAAAAAAAAAAAAAAAAAAAAAA1.sock", ""}, // "/tmp/a" is no option: the whole argument is the path
		{"/" + strings.Repeat("x", 106), ""},                      // 107 bytes and the NUL: sun_path exactly
		{"/" + strings.Repeat("x", 107), "108 bytes"},
		{long + strings.Repeat("z", 108-len(long)), "holds at most 107"},
		{"fd=3", "not an absolute path"},
		{"path=x,y", "not an absolute path"},
	} {
		err := CHAPISocket(c.path)
		if c.refusal == "" && err != nil || c.refusal != "" && (err == nil || !strings.Contains(err.Error(), c.refusal)) {
			t.Errorf("CHAPISocket(%q) = %v, want %q", c.path, err, c.refusal)
		}
		if c.refusal != "" && (Driver{Name: CloudHypervisor}).Preflight(c.path) == nil {
			t.Errorf("Preflight(%q) passes a socket CH cannot serve on", c.path)
		}
	}
}
