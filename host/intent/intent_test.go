package intent

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	// Child mode: publish an intent, say so, then hang until killed.
	if path := os.Getenv("INTENT_TEST_CHILD"); path != "" {
		if _, err := Publish(path, Intent{Kind: "create", Sandbox: "child"}); err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("published\n")
		select {}
	}
	os.Exit(m.Run())
}

func TestPublishIsLeasedUntilRelease(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.create-intent.json")
	h, err := Publish(path, Intent{Kind: "create", Sandbox: "x", Covers: []string{"disks/x.raw"}})
	if err != nil {
		t.Fatal(err)
	}
	if held, err := LeaseHeld(path); err != nil || !held {
		t.Fatalf("fresh intent: held=%v err=%v", held, err)
	}
	info, _ := os.Stat(path)
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("intent mode %o", info.Mode().Perm())
	}
	in, err := Read(path)
	if err != nil || in.Sandbox != "x" || in.Covers[0] != "disks/x.raw" || in.Pid != os.Getpid() || in.Schema != SchemaVersion {
		t.Fatalf("Read = %+v, %v", in, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("staging file left behind: %v", entries)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if held, _ := LeaseHeld(path); held {
		t.Fatal("lease still held after Release")
	}
	if err := Retire(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("retired intent still there")
	}
	if err := Retire(path); err != nil {
		t.Fatalf("retiring twice: %v", err)
	}
}

func TestPublishNeverReplaces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.create-intent.json")
	os.WriteFile(path, []byte("theirs"), 0o600)
	if _, err := Publish(path, Intent{Kind: "create"}); err == nil {
		t.Fatal("published over an existing intent")
	}
	if data, _ := os.ReadFile(path); string(data) != "theirs" {
		t.Fatalf("existing intent changed to %q", data)
	}
}

func TestReadUnreadable(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"garbage": "{", "newer": `{"schema":9}`} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		if _, err := Read(p); !errors.Is(err, ErrUnreadable) {
			t.Errorf("%s: Read = %v, want ErrUnreadable", name, err)
		}
	}
	if _, err := Read(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
}

// The kernel drops the lease of a creator killed with SIGKILL.
func TestLeaseDiesWithItsHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.create-intent.json")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "INTENT_TEST_CHILD="+path)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "published" {
		cmd.Process.Kill()
		t.Fatalf("child said %q", line)
	}
	if held, _ := LeaseHeld(path); !held {
		t.Fatal("child's lease not visible")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if held, err := LeaseHeld(path); err != nil || held {
		t.Fatalf("after SIGKILL: held=%v err=%v", held, err)
	}
	if _, err := Read(path); err != nil {
		t.Fatalf("the marker itself must survive its creator: %v", err)
	}
}

// The fallback for filesystems without O_TMPFILE stages the marker under a
// temporary name: leased before the rename, nothing staged left after it,
// and never over an existing marker.
func TestPublishStagedFallback(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "y.create-intent.json")
	h, err := publishStaged(path, []byte(`{"kind":"create","sandbox":"y"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if held, err := LeaseHeld(path); err != nil || !held {
		t.Fatalf("staged publish: held=%v err=%v", held, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("staging file left behind: %v", entries)
	}
	if _, err := publishStaged(path, []byte(`{}`)); err == nil {
		t.Fatal("staged publish over an existing intent")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("a refused staged publish left %v", entries)
	}
}
