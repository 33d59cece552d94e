package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

var nexusBin string

// e2eParallel is how many end-to-end tests run at once per core by default.
const e2eParallel = 4

func TestMain(m *testing.M) {
	// The end-to-end tests wait on processes, sockets and fsyncs, not on
	// the CPU: unless -parallel says otherwise, run more of them at once
	// than there are cores (go test's default is GOMAXPROCS).
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(e2eParallel*runtime.GOMAXPROCS(0)))
	}
	bin, remove, err := testutil.BuildNexus()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	nexusBin = bin
	code := m.Run()
	removeGuestAssets()
	if left := stopBinaryDaemons(nexusBin); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "stopped daemons the tests left running: %v\n", left)
	}
	remove()
	os.Exit(code)
}

// sharedRootEnv is the environment of a command whose new sandboxes get
// the default root (an overlay over the shared cache entry wherever the
// guest runs nexus's agent as init) whatever the caller's environment asks.
var sharedRootEnv = []string{"NEXUS_VM_ROOT="}

// copyRoot makes the new sandboxes of root keep a private copy of their
// OS disk (`[vm] root = "copy"` in its config file), for a test of what
// only that mode has: the os-disk step, its crash points, a sandbox's own
// disks/<ULID>.raw. Every command on root, a daemon it starts included,
// reads the file.
func copyRoot(t testing.TB, root string) {
	t.Helper()
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\nroot = \"copy\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

type result struct {
	code           int
	stdout, stderr string
}

func nexus(t testing.TB, root string, args ...string) result {
	t.Helper()
	return nexusEnv(t, root, nil, args...)
}

func nexusEnv(t testing.TB, root string, env []string, args ...string) result {
	t.Helper()
	return nexusBinEnv(t, nexusBin, root, env, args...)
}

// wantFailure asserts exit code and a single-line error naming the cause.
func wantFailure(t *testing.T, r result, code int, mention string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d (stderr %q)", r.code, code, r.stderr)
	}
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "nexus: ") {
		t.Fatalf("want one 'nexus: ...' error line, got %q", r.stderr)
	}
	if !strings.Contains(r.stderr, mention) {
		t.Fatalf("error %q does not mention %q", r.stderr, mention)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	wantFailure(t, nexus(t, root, "events", "--no-such-flag"), 2, "unknown flag")
	wantFailure(t, nexus(t, root, "frobnicate"), 2, "unknown command")
	wantFailure(t, nexus(t, root, "events", "--since", "minus-one"), 2, "since")
	wantFailure(t, nexus(t, root, "events", "--type", "sandbox.teleported"), 2, "unknown event type")
	wantFailure(t, nexus(t, root, "events", "--until", "yesterday"), 2, "--until")
	wantFailure(t, nexus(t, root, "events", "--tail", "-1"), 2, "--tail")
	wantFailure(t, nexus(t, root, "events", "--follow", "--until", "5"), 2, "--follow")
	wantFailure(t, nexus(t, root, "events", "--type", "sandbox", "--type", "nosuch"), 2, "unknown event type")
	wantFailure(t, nexus(t, root, "inspect"), 2, "requires at least 1 arg")
	wantFailure(t, nexus(t, root, "help", "nosuch"), 2, "unknown help topic")
	wantFailure(t, nexus(t, root, "volume", "create", "data"), 2, "--size")
	wantFailure(t, nexus(t, root, "fork", "some-sandbox", "--count", "0"), 2, "--count 0")
	wantFailure(t, nexus(t, root, "--driver", "firecracker", "ls"), 2, "--driver")
	wantFailure(t, nexus(t, root, "guest", "initramfs", "-o", "x.gz"), 2, "--kernel-release")
	wantFailure(t, nexus(t, root, "guest", "initramfs", "--kernel-release", "../x", "-o", "x.gz"), 2, "--kernel-release")
	wantFailure(t, nexus(t, root, "daemon", "--listen", "127.0.0.1:0", "--tls-cert", "c.pem"), 2, "--tls-key")
	wantFailure(t, nexus(t, root, "daemon", "--tls-cert", "c.pem", "--tls-key", "k.pem"), 2, "--listen")
	wantFailure(t, nexus(t, root, "daemon", "--listen", "127.0.0.1:0", "--tls-cert", "nope.pem", "--tls-key", "nope.key"), 1, "TLS")
	wantFailure(t, nexus(t, root, "daemon", "--listen", "0.0.0.0:0", "--allow-remote"), 1, "--tls-cert")
	wantFailure(t, nexus(t, root, "daemon", "--listen", "0.0.0.0:0"), 1, "loopback")
}

// What people type from other tools: aliases, docker's named formats,
// short flags, a word that is not a verb here, and a missing argument,
// which prints the usage line.
func TestWordsFromOtherTools(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	wantFailure(t, nexus(t, root, "rm"), 2, "usage: nexus rm ID... [flags] (see `nexus rm --help`)")
	wantFailure(t, nexus(t, root, "snapshot", "create", "web"), 2, "there is no `nexus snapshot create`: `nexus snapshot web` snapshots a sandbox")
	wantFailure(t, nexus(t, root, "snapshot", "lss"), 1, "did you mean `nexus snapshot ls`?")
	for _, alias := range []string{"remove", "delete"} {
		wantFailure(t, nexus(t, root, alias, "nosuch"), 1, `no sandbox "nosuch"`)
	}
	for _, args := range [][]string{{"ps"}, {"list"}, {"ls", "--format", "table"}} {
		if r := nexus(t, root, args...); r.code != 0 || !strings.HasPrefix(r.stdout, "ID ") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	if r := nexus(t, root, "ls", "--format", "json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("ls --format json: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := nexus(t, root, "events", "-n", "1"); r.code != 0 {
		t.Errorf("events -n 1: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestReleaseBuildHasNoTestHooks builds nexus as a user would (no build
// tags) and checks that nothing of the failure injection or the made-up
// demo events is in it: not the environment variables' names, not the
// command.
func TestReleaseBuildHasNoTestHooks(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "nexus")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{"NEXUS_CRASH_AT", "NEXUS_PAUSE_AT", "NEXUS_FAIL_APPEND"} {
		if bytes.Contains(raw, []byte(hook)) {
			t.Errorf("release binary reads %s", hook)
		}
	}
	// The test build has them, or the check above proves nothing.
	if test, _ := os.ReadFile(nexusBin); !bytes.Contains(test, []byte("NEXUS_CRASH_AT")) {
		t.Fatal("test binary lacks NEXUS_CRASH_AT: the check is blind")
	}
	out, err := exec.Command(bin, "--state-dir", t.TempDir(), "demo").CombinedOutput()
	if code := exitCodeOf(err); code != 2 || !strings.Contains(string(out), "unknown command") {
		t.Fatalf("release `nexus demo`: exit %d, %q; want the unknown-command usage error", code, out)
	}
}

func exitCodeOf(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

func TestVersion(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	text := nexus(t, root, "--version")
	mustOK(t, text, "--version")
	if !strings.HasPrefix(text.stdout, "nexus ") || !strings.Contains(text.stdout, "go1.") || !strings.Contains(text.stdout, "nats-server v2.") {
		t.Fatalf("--version = %q; want nexus, Go and nats-server versions", text.stdout)
	}
	if sub := nexus(t, root, "version"); sub.stdout != text.stdout {
		t.Fatalf("`version` %q differs from `--version` %q", sub.stdout, text.stdout)
	}
	r := nexus(t, root, "version", "--json")
	mustOK(t, r, "version --json")
	var m map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"version", "go", "nats_server", "modified"} {
		if _, ok := m[k]; !ok {
			t.Errorf("version --json lacks %q: %s", k, r.stdout)
		}
	}
}

func TestDemoEventsLsInspect(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	r := nexus(t, root, "demo")
	if r.code != 0 {
		t.Fatalf("demo: %+v", r)
	}
	id := strings.Fields(r.stdout)[len(strings.Fields(r.stdout))-1]
	if _, err := ulid.ParseStrict(id); err != nil {
		t.Fatalf("demo printed %q, no sandbox id", r.stdout)
	}
	r = nexus(t, root, "events", "--all", "--json")
	var types []string
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var e struct {
			Seq     uint64 `json:"seq"`
			Type    string `json:"type"`
			Sandbox string `json:"sandbox"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("events --json line %q: %v", sc.Text(), err)
		}
		if e.Seq != uint64(len(types)+1) || e.Sandbox != id {
			t.Fatalf("event %+v out of order or of another sandbox", e)
		}
		types = append(types, e.Type)
	}
	if len(types) != 10 || types[0] != "saga.started" || types[3] != "sandbox.created" || types[8] != "sandbox.removed" {
		t.Fatalf("demo journaled %v", types)
	}
	if r := nexus(t, root, "events", "--type", "sandbox", "--since", "5"); strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, "sandbox.removed") {
		t.Fatalf("filtered events: %q", r.stdout)
	}
	if r := nexus(t, root, "events", "--sandbox", ulid.Make().String()); r.code != 0 || r.stdout != "" {
		t.Fatalf("events of another sandbox: %+v", r)
	}
	// The demo sandbox was removed, so ls is empty and inspect refuses.
	if r := nexus(t, root, "ls", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("ls --json = %+v", r)
	}
	wantFailure(t, nexus(t, root, "inspect", id), 1, "no sandbox")
}

// A --listen port already taken fails the daemon at once with the address
// and the kernel's reason, rather than waiting for readiness and blaming
// that.
func TestDaemonListenBusyNamesTheAddress(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	r := nexus(t, t.TempDir(), "daemon", "--listen", addr)
	wantFailure(t, r, 1, "--listen "+addr+": listen tcp "+addr+": bind: address already in use")
}

func TestDaemonServesCommands(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	d := testutil.Start(t, exec.Command(nexusBin, "--state-dir", root, "daemon"))
	d.WaitLog(t, 2*time.Minute, "\n")
	line, _, _ := strings.Cut(d.Stderr.String(), "\n")
	// Not a terminal: one JSON object per line, fields named.
	var rec struct {
		Level, Msg, Root string
		Pid              int
	}
	if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Level != "INFO" || rec.Msg != "serving" || rec.Root == "" || rec.Pid != d.Cmd.Process.Pid {
		t.Fatalf("daemon log line %q (%v) is not a JSON record of serving with root and pid", line, err)
	}
	if r := nexus(t, root, "demo"); r.code != 0 {
		t.Fatalf("demo through daemon: %+v", r)
	}
	if r := nexus(t, root, "events", "--all", "-q"); r.code != 0 || strings.Count(r.stdout, "\n") != 10 {
		t.Fatalf("events through daemon: %+v", r)
	}
	if code := d.Stop(t); code != 0 {
		t.Fatalf("daemon exit %d after SIGTERM:\n%s", code, d.Stderr.String())
	}
	if _, err := os.Stat(filepath.Join(root, "nexus.sock")); !os.IsNotExist(err) {
		t.Fatalf("control socket left behind: %v", err)
	}
	if r := nexus(t, root, "events", "--all", "-q"); r.code != 0 || strings.Count(r.stdout, "\n") != 10 {
		t.Fatalf("events after the daemon stopped: %+v", r)
	}
}

// storeDigest hashes every file of the journal store (not the LOCK file,
// whose pid text changes with each owner).
func storeDigest(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		// LOCK is the open's flock; VERIFIED caches which blocks an open
		// checked (a stale one costs a full check, never a wrong answer),
		// so neither is journal content.
		if err != nil || d.IsDir() || d.Name() == "LOCK" || d.Name() == "VERIFIED" {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[p] = sha256.Sum256(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameDigest(a, b map[string][32]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// blockFile is the journal's message block, to be spoilt by the caller:
// the daemon serving root is stopped first, as an operator would before
// touching the store.
func blockFile(t *testing.T, root string) string {
	t.Helper()
	stopDaemons(root)
	blocks, _ := filepath.Glob(filepath.Join(root, "journal", "jetstream", "$G", "streams", "NEXUS", "msgs", "*.blk"))
	if len(blocks) == 0 {
		t.Fatal("no message block in the journal")
	}
	return blocks[0]
}

func TestDamagedJournalIsRefusedAndNotRewritten(t *testing.T) {
	t.Parallel()
	damage := map[string]func(t *testing.T, path string){
		"truncated": func(t *testing.T, path string) {
			info, _ := os.Stat(path)
			if err := os.Truncate(path, info.Size()-7); err != nil {
				t.Fatal(err)
			}
		},
		"corrupted": func(t *testing.T, path string) {
			data, _ := os.ReadFile(path)
			data[len(data)/2] ^= 0x5a
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, spoil := range damage {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			if r := nexus(t, root, "demo"); r.code != 0 {
				t.Fatalf("demo: %+v", r)
			}
			stopDaemons(root)                                // the store is changed behind nexus's back
			os.RemoveAll(filepath.Join(root, "projections")) // force a full read of the journal
			spoil(t, blockFile(t, root))
			before := storeDigest(t, filepath.Join(root, "journal"))
			for _, cmd := range []string{"ls", "events"} {
				wantFailure(t, nexus(t, root, cmd), 1, "damaged")
			}
			if after := storeDigest(t, filepath.Join(root, "journal")); !sameDigest(before, after) {
				t.Fatal("a refused open changed the journal")
			}
		})
	}
}

func TestNewerJournalIsRefused(t *testing.T) {
	t.Parallel()
	t.Run("format stamp", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		nexus(t, root, "demo")
		stopDaemons(root) // the store is changed behind nexus's back
		os.WriteFile(filepath.Join(root, "journal", "FORMAT"), []byte("nexus-journal 7\n"), 0o600)
		before := storeDigest(t, filepath.Join(root, "journal"))
		wantFailure(t, nexus(t, root, "ls"), 1, "newer nexus")
		if !sameDigest(before, storeDigest(t, filepath.Join(root, "journal"))) {
			t.Fatal("journal changed")
		}
	})
	t.Run("event schema", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		nexus(t, root, "demo")
		stopDaemons(root) // the store is changed behind nexus's back
		os.RemoveAll(filepath.Join(root, "projections"))
		appendFutureEvent(t, filepath.Join(root, "journal"))
		before := storeDigest(t, filepath.Join(root, "journal"))
		wantFailure(t, nexus(t, root, "ls"), 1, "newer than supported")
		wantFailure(t, nexus(t, root, "events"), 1, "newer than supported")
		if !sameDigest(before, storeDigest(t, filepath.Join(root, "journal"))) {
			t.Fatal("journal changed")
		}
	})
}

// appendFutureEvent writes what a newer nexus would: a known type at a
// schema this build has never heard of.
func appendFutureEvent(t *testing.T, dir string) {
	t.Helper()
	stopDaemons(filepath.Dir(dir)) // the store is opened here, not through nexus
	j, err := journal.Open(context.Background(), journal.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	id := ulid.Make()
	data, err := msgpack.Marshal(map[string]any{"f": 1, "id": id[:], "t": "sandbox.stopped", "v": 9, "ts": time.Now().UnixNano(), "p": map[string]any{"hover": true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Append(context.Background(), journal.Message{Subject: "nexus.events.sandbox.stopped._", ID: id.String(), Data: data}); err != nil {
		t.Fatal(err)
	}
}

func TestUnusableStateRoot(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	wantFailure(t, nexus(t, file, "ls"), 1, "state root")

	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	wantFailure(t, nexus(t, open, "ls"), 1, "writable by group or others (mode 0777; chmod 700 "+open+")")

	real, link := filepath.Join(dir, "real"), filepath.Join(dir, "link")
	os.Mkdir(real, 0o700)
	os.Symlink(real, link)
	wantFailure(t, nexus(t, link, "ls"), 1, "is a symlink (to "+real+"), and nexus follows none in its root: give the directory itself (--state-dir "+real+")")

	// A read-only mount is unwritable even for root; mode bits are not.
	ro := filepath.Join(dir, "ro")
	os.Mkdir(ro, 0o700)
	if out, err := exec.Command("mount", "--bind", "-o", "ro", ro, ro).CombinedOutput(); err != nil {
		t.Logf("read-only case not run: cannot bind-mount here: %v %s", err, out)
		return
	}
	defer exec.Command("umount", ro).Run()
	wantFailure(t, nexus(t, ro, "ls"), 1, "not writable")
}

// pflag takes a flag's first `quoted` word as the name of its value in
// --help; a quoted command in a flag's text would print as that name.
func TestFlagValueNamesAreWords(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.LocalFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " /") {
					t.Errorf("%s --%s: --help names its value %q", c.CommandPath(), f.Name, name)
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot())
}
