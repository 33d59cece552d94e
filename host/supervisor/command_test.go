package supervisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// A supervisor started with Argv is found by its sandbox and state
// directory, and only by those.
func TestProcessesFindsWhatArgvStarted(t *testing.T) {
	dir := t.TempDir()
	o := ServeOptions{SandboxID: "01HZZZZZZZZZZZZZZZZZZZZZZS", StateDir: filepath.Join(dir, "s"), IIDSocket: filepath.Join(dir, "iid.sock")}
	argv := Argv(os.Args[0], o)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), childWaitEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	if got := Processes(o.SandboxID, o.StateDir); !slices.Equal(got, []int{cmd.Process.Pid}) {
		t.Fatalf("Processes = %v, want [%d]", got, cmd.Process.Pid)
	}
	if got := Processes(o.SandboxID, o.StateDir+"x"); len(got) != 0 {
		t.Fatalf("Processes of another state dir = %v", got)
	}
	if got := Processes("01HZZZZZZZZZZZZZZZZZZZZZZT", o.StateDir); len(got) != 0 {
		t.Fatalf("Processes of another sandbox = %v", got)
	}
}
