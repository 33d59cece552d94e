package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// procStdin is proc with stdin.
func procStdin(t *testing.T, root string, stdin string, args ...string) result {
	t.Helper()
	stopDaemonsAtEnd(t, root)
	cmd := exec.Command(nexusBin, append([]string{"--state-dir", root, "--driver", "process"}, args...)...)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

// exec runs commands in the guest through the agent (on the process
// driver, the stand-in guest runs them on the host under its guest root)
// and passes their status through as its own exit code.
func TestExecStatusStreamsAndStdin(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t), "--handle", "ex")

	r := proc(t, root, "exec", "ex", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	if r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q; want 7, out, err", r.code, r.stdout, r.stderr)
	}
	if r := mustOK(t, proc(t, root, "exec", "ex", "--env", "FOO=bar baz", "-w", "/workspace", "--", "sh", "-c", "echo \"$FOO\"; pwd"), "exec --env -w"); !strings.HasPrefix(r.stdout, "bar baz\n") || !strings.HasSuffix(r.stdout, "/workspace\n") {
		t.Errorf("exec --env -w printed %q", r.stdout)
	}
	// Without -i the command reads nothing; with it, nexus's stdin.
	if r := mustOK(t, procStdin(t, root, "hello", "exec", sb.ID, "--", "wc", "-c"), "exec without -i"); strings.TrimSpace(r.stdout) != "0" {
		t.Errorf("exec without -i read %q bytes", r.stdout)
	}
	if r := mustOK(t, procStdin(t, root, "hello", "exec", "-i", sb.ID, "--", "wc", "-c"), "exec -i"); strings.TrimSpace(r.stdout) != "5" {
		t.Errorf("exec -i read %q bytes, want 5", r.stdout)
	}
	// A signal that kills the command is 128+n; a missing program 127.
	if r := proc(t, root, "exec", sb.ID, "--", "sh", "-c", "kill -TERM $$"); r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("killed by SIGTERM: exit %d (stderr %q), want %d", r.code, r.stderr, 128+int(syscall.SIGTERM))
	}
	wantFailure(t, proc(t, root, "exec", sb.ID, "--", "no-such-program-nexus"), 127, `nexus: exec: the guest could not start "no-such-program-nexus": executable file not found in $PATH`)
	wantFailure(t, proc(t, root, "exec", sb.ID, "sh"), 2, "nexus exec ID -- CMD")
	wantFailure(t, proc(t, root, "exec", sb.ID, "--env", "NOEQUALS", "--", "true"), 2, "K=V")
	// -t: a terminal in the guest, which turns the command's "\n" into
	// "\r\n" and echoes what -i sends it.
	if r := proc(t, root, "exec", "-t", sb.ID, "--", "sh", "-c", "test -t 0 && test -t 1 && echo on a tty; exit 4"); r.code != 4 || r.stdout != "on a tty\r\n" {
		t.Errorf("exec -t: exit %d, stdout %q, stderr %q; want 4 and the line through a terminal", r.code, r.stdout, r.stderr)
	}
	if r := procStdin(t, root, "abc\n", "exec", "-i", "-t", sb.ID, "--", "sh", "-c", "read x; echo got $x >&2"); r.code != 0 || !strings.Contains(r.stdout, "got abc\r\n") {
		t.Errorf("exec -i -t: exit %d, stdout %q, stderr %q; want the answer on stdout", r.code, r.stdout, r.stderr)
	}

	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	wantFailure(t, proc(t, root, "exec", sb.ID, "--", "true"), 1, "not running")
}

// Ctrl-C at `nexus exec` reaches the guest process, which decides what
// it means: here it traps SIGINT and exits 5, and nexus exits 5.
func TestExecForwardsInterrupt(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	stopDaemonsAtEnd(t, root)
	cmd := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "exec", sb.ID, "--",
		"sh", "-c", `trap 'echo got INT; exit 5' INT; echo ready; while :; do sleep 0.05; done`)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	var out testutil.Buffer
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the guest command ready", func() bool { return strings.Contains(out.String(), "ready") })
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("nexus exec did not end after SIGINT")
	}
	if code := cmd.ProcessState.ExitCode(); code != 5 || !strings.Contains(out.String(), "got INT") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 5 and the trap's line", code, out.String(), errb.String())
	}
}

// cp moves one file each way through the agent's read and write. (The
// stand-in guest maps the paths the protocol carries under its guest root,
// not those inside a command's arguments: commands here use -w and
// relative names.)
func TestCpBothWays(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t), "--handle", "cpy")
	dir := t.TempDir()
	data := make([]byte, 3<<20+17) // several frames
	rand.Read(data)
	local := filepath.Join(dir, "in.bin")
	if err := os.WriteFile(local, data, 0o640); err != nil {
		t.Fatal(err)
	}
	mustOK(t, proc(t, root, "cp", local, "cpy:/workspace/in.bin"), "cp in")
	// The guest sees the bytes and the mode.
	r := mustOK(t, proc(t, root, "exec", "cpy", "-w", "/workspace", "--", "sh", "-c", "wc -c < in.bin; stat -c %a in.bin"), "size in guest")
	if r.stdout != "3145745\n640\n" {
		t.Errorf("guest sees %q, want size 3145745 and mode 640", r.stdout)
	}

	out := filepath.Join(dir, "out.bin")
	mustOK(t, proc(t, root, "cp", "cpy:/workspace/in.bin", out), "cp out")
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("cp out: %d bytes, %v; want the %d copied in", len(got), err, len(data))
	}
	// A local directory receives the file under its guest name; "-" is stdout.
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	mustOK(t, proc(t, root, "cp", sb.ID+":/workspace/in.bin", sub), "cp out to a directory")
	if got, _ := os.ReadFile(filepath.Join(sub, "in.bin")); !bytes.Equal(got, data) {
		t.Error("cp into a directory did not write DIR/in.bin")
	}
	mustOK(t, proc(t, root, "exec", sb.ID, "-w", "/workspace", "--", "sh", "-c", "printf small > s"), "exec write")
	if r := mustOK(t, proc(t, root, "cp", sb.ID+":/workspace/s", "-"), "cp to stdout"); r.stdout != "small" {
		t.Errorf("cp to stdout printed %q", r.stdout)
	}
	if r := mustOK(t, procStdin(t, root, "from stdin", "cp", "-", sb.ID+":/workspace/t"), "cp from stdin"); r.stdout != "" {
		t.Errorf("cp from stdin printed %q", r.stdout)
	}
	if r := mustOK(t, proc(t, root, "exec", sb.ID, "-w", "/workspace", "--", "cat", "t"), "cat"); r.stdout != "from stdin" {
		t.Errorf("guest file from stdin holds %q", r.stdout)
	}

	// Refusals: one line each, naming the cause; no partial file left.
	wantFailure(t, proc(t, root, "cp", sub, sb.ID+":/workspace/d"), 1, "not a regular file")
	wantFailure(t, proc(t, root, "cp", sb.ID+":/workspace/nosuch", filepath.Join(dir, "x")), 1, "no such file")
	// A missing directory is named, never a temporary file's or the
	// stand-in's own path.
	for _, c := range [][]string{{local, sb.ID + ":/workspace/nodir/x", "no such directory /workspace/nodir"}, {sb.ID + ":/workspace/s", filepath.Join(dir, "nodir", "x"), "no such directory " + filepath.Join(dir, "nodir")}} {
		r := proc(t, root, "cp", c[0], c[1])
		wantFailure(t, r, 1, c[2])
		if strings.Contains(r.stderr, ".nexus-") || strings.Count(r.stderr, "/workspace/nodir/x") > 1 {
			t.Errorf("cp %s %s: %q", c[0], c[1], r.stderr)
		}
	}
	if exists(filepath.Join(dir, "x")) {
		t.Error("a failed cp out left its destination")
	}
	wantFailure(t, proc(t, root, "cp", sb.ID+":/workspace", filepath.Join(dir, "y")), 1, "is a directory")
	wantFailure(t, proc(t, root, "cp", sb.ID+":workspace/s", filepath.Join(dir, "y")), 1, "not absolute")
	wantFailure(t, proc(t, root, "cp", local, filepath.Join(dir, "z")), 2, "ID:PATH")
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Errorf("the local directory holds %d entries, want in.bin, out.bin and sub: a failed cp left a file", len(entries))
	}
}

// A stop whose flush the agent does not confirm succeeds, journals no
// acknowledgement and says so, naming the cause and what the next start
// does. --flush-timeout bounds the wait: an agent that reads but never
// answers (the process driver's guest while its VM is paused) costs the
// deadline, not the default 10 s.
func TestStopSaysWhenTheFlushFailed(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	r := mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	if strings.Contains(r.stderr, "warning") {
		t.Fatalf("an acknowledged stop warned: %q", r.stderr)
	}
	mustOK(t, proc(t, root, "start", sb.ID), "start")
	// The agent's socket is gone: no flush can be confirmed.
	os.Remove(filepath.Join(root, "run", "sb-"+sb.ID+".vsock"))
	r = mustOK(t, proc(t, root, "stop", sb.ID), "stop without an agent")
	for _, want := range []string{"nexus: warning: " + sb.ID + " stopped without a flush acknowledgement", "guest agent", "--accept-unflushed"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stop's warning %q does not say %q", r.stderr, want)
		}
	}
	if n := strings.Count(nexus(t, root, "events", "--type", "flush.acknowledged", "--sandbox", sb.ID).stdout, "\n"); n != 1 {
		t.Errorf("%d flush acknowledgements, want the first stop's only", n)
	}

	mustOK(t, proc(t, root, "start", sb.ID), "start again")
	pauseVM(t, root, sb.ID)
	began := time.Now()
	r = mustOK(t, proc(t, root, "stop", "--flush-timeout", "1s", sb.ID), "stop with a hung agent")
	if took := time.Since(began); took > 8*time.Second {
		t.Errorf("stop --flush-timeout 1s took %v", took)
	}
	if !strings.Contains(r.stderr, "timeout") {
		t.Errorf("stop's warning does not name the timeout: %q", r.stderr)
	}
}

// pauseVM pauses a process-driver VM through its API, as nothing in nexus
// leaves a running sandbox paused.
func pauseVM(t *testing.T, root, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vmm.NewClient(filepath.Join(root, "run", "sb-"+id+".sock")).Pause(ctx); err != nil {
		t.Fatal(err)
	}
}

// The process driver's "guest" is a process on this host: a command that
// boots or reaches one tells a person so, once; a script (stderr not a
// terminal) keeps exec's stderr and its one-line errors as they were.
func TestProcessDriverSaysItsGuestRunsOnTheHost(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	img := makeImage(t)
	for _, args := range [][]string{
		{"create", "--image", img, "--handle", "onhost"},
		{"fork", "onhost", "--count", "2"}, // two boots, one notice
		{"exec", "onhost", "--", "true"},
	} {
		out, code := onTerminal(t, root, "", args...)
		if n := strings.Count(strings.ReplaceAll(out, "\r\n", " "), lifecycle.HostGuestNotice); code != 0 || n != 1 {
			t.Errorf("nexus %s on a terminal: exit %d, told the host-guest notice %d time(s), want once: %q", args[0], code, n, out)
		}
	}
	if r := mustOK(t, proc(t, root, "create", "--image", img), "create, stderr piped"); strings.Contains(r.stderr, lifecycle.HostGuestNotice) {
		t.Errorf("create with stderr piped told the notice: %q", r.stderr)
	}
	if r := mustOK(t, proc(t, root, "exec", "onhost", "--", "sh", "-c", "echo err >&2"), "exec"); r.stderr != "err\n" {
		t.Errorf("exec's piped stderr = %q, want only the guest command's", r.stderr)
	}
	wantFailure(t, proc(t, root, "exec", "onhost", "--", "no-such-program-nexus"), 127, "could not start")
}
