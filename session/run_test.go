package session_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/session"
)

// keptRun runs script under `nexus run --keep` semantics (no client run,
// so no nexus binary), its stdout in a file, and returns status and output.
func keptRun(t *testing.T, ctx context.Context, env []string, script string) (int, string) {
	t.Helper()
	root := t.TempDir()
	out, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	code, err := session.Run(ctx, session.RunOptions{
		Root: root, Driver: "process", Keep: true, Argv: []string{"sh", "-c", script},
		Env: env, Stdout: out, Stderr: os.Stderr,
	})
	if err != nil {
		t.Fatalf("run %q: %v", script, err)
	}
	data, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	return code, strings.ReplaceAll(string(data), root, "ROOT")
}

// The command's status is run's: its exit code, or 128+signal.
func TestRunReturnsTheCommandsStatus(t *testing.T) {
	if code, _ := keptRun(t, context.Background(), nil, "exit 7"); code != 7 {
		t.Fatalf("exit 7: run returned %d", code)
	}
	if code, _ := keptRun(t, context.Background(), nil, "kill -KILL $$"); code != 128+9 {
		t.Fatalf("killed by SIGKILL: run returned %d, want 137", code)
	}
}

// A stop request (the context) reaches the command as SIGTERM.
func TestRunForwardsAStopAsSIGTERM(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	// exec: the shell is the process that gets the signal, not its child.
	if code, _ := keptRun(t, ctx, nil, "exec sleep 60"); code != 128+15 {
		t.Fatalf("stopped command: run returned %d, want 143", code)
	}
	if waited := time.Since(start); waited > 30*time.Second {
		t.Fatalf("the stop took %v: the command ran to its end", waited)
	}
}

// The command's own nexus calls reach the run's state root and driver, and
// an inherited run id is not passed on (--keep binds nothing).
func TestRunEnvironment(t *testing.T) {
	env := []string{"PATH=" + os.Getenv("PATH"), "NEXUS_RUN_ID=inherited", "KEEP=me"}
	_, out := keptRun(t, context.Background(), env, `echo "run=$NEXUS_RUN_ID root=$NEXUS_STATE_DIR driver=$NEXUS_DRIVER keep=$KEEP"`)
	if want := "run= root=ROOT driver=process keep=me\n"; out != want {
		t.Fatalf("the command saw %q, want %q", out, want)
	}
}
