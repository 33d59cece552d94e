package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// hangLimit only tells a hang from slowness on a loaded machine: a command
// blocked on a FIFO never returns, a slow one returns well within it.
const hangLimit = 3 * time.Minute

// bounded runs nexus with the process driver and fails the test if it had
// to be killed: a planted FIFO must be an error, never a hang.
func bounded(t *testing.T, root string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, nexusBin, append([]string{"--state-dir", root, "--driver", "process"}, args...)...)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_CONFIG=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("nexus %s hung (killed after %s): %s", strings.Join(args, " "), hangLimit, errb.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

// refusedOneLine requires exit 1 and a single-line error mentioning want.
func refusedOneLine(t *testing.T, r result, want string) {
	t.Helper()
	msg := strings.TrimRight(r.stderr, "\n")
	if r.code != 1 || strings.Contains(msg, "\n") || !strings.Contains(msg, want) || strings.Contains(msg, "undo ") {
		t.Fatalf("want exit 1 and one line mentioning %q, got exit %d:\n%s", want, r.code, r.stderr)
	}
	t.Logf("refused: %s", msg)
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// replaceWithLink moves path's content outside the root (keeping it
// intact) and leaves a symlink to it at path.
func replaceWithLink(t *testing.T, path, outside string) {
	t.Helper()
	if err := os.Rename(path, outside); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, path); err != nil {
		t.Fatal(err)
	}
}

// treeDigest hashes names, modes, sizes and contents under dir, to show a
// command neither wrote nor created anything there.
func treeDigest(t *testing.T, dir string) [32]byte {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h.Write([]byte(p + "\x00" + info.Mode().String() + "\x00"))
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// TestPlantedFIFOsAreOneLineErrors plants a FIFO where nexus reads its own
// files; every command must fail at once, naming it.
func TestPlantedFIFOsAreOneLineErrors(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", image)
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")

	cases := []struct {
		name  string
		path  string
		run   []string
		mayBe bool // the file may not exist before planting
	}{
		{"projection snapshot", filepath.Join(root, "projections", "sagas.snap"), []string{"ls"}, false},
		{"sandbox store", filepath.Join(root, "projections", "sandboxes.db"), []string{"ls"}, false},
		{"journal FORMAT", filepath.Join(root, "journal", "FORMAT"), []string{"ls"}, false},
		{"config.toml", filepath.Join(root, "config.toml"), []string{"start", sb.ID}, true},
		{"snapshot manifest", filepath.Join(root, "snapshots", sb.ID, snap, "manifest.json"), []string{"restore", snap}, false},
	}
	entries, _ := filepath.Glob(filepath.Join(root, "images", "img-*", "identity.json"))
	if len(entries) != 1 {
		t.Fatalf("want one image-cache identity, got %v", entries)
	}
	cases = append(cases, struct {
		name  string
		path  string
		run   []string
		mayBe bool
	}{"image-cache identity.json", entries[0], []string{"create", "--image", image}, false})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A daemon still running holds what it read at start (and
			// writes its snapshots when it stops): plant behind none.
			stopDaemons(root)
			saved, err := os.ReadFile(c.path)
			if err != nil && !(c.mayBe && os.IsNotExist(err)) {
				t.Fatal(err)
			}
			mkfifo(t, c.path)
			refusedOneLine(t, bounded(t, root, c.run...), "fifo")
			// Put the file back so the next case meets only its own plant.
			os.Remove(c.path)
			if saved != nil {
				if err := os.WriteFile(c.path, saved, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	mustOK(t, bounded(t, root, "ls"), "ls after the FIFOs are gone")

	// A FIFO under an intent's name: the reaper's lease probe and recover's
	// intent sweep open it. Neither may block; the reaper keeps it, since
	// an unreadable intent may belong to a live creator.
	t.Run("create intent", func(t *testing.T) {
		fifo := filepath.Join(root, "disks", "01JABCDEFGHJKMNPQRSTVWXYZ0.create-intent.json")
		mkfifo(t, fifo)
		r := mustOK(t, bounded(t, root, "reap", "--json"), "reap")
		if !strings.Contains(r.stdout, "not a regular file") {
			t.Fatalf("reap does not say why it kept the FIFO:\n%s", r.stdout)
		}
		mustOK(t, bounded(t, root, "recover"), "recover")
		if _, err := os.Lstat(fifo); err != nil {
			t.Fatalf("the FIFO was removed: %v", err)
		}
		os.Remove(fifo)
	})
}

// TestPlantedSymlinksAreRefused plants a symlink where nexus writes its own
// files and directories: the command fails with one
// line and nothing outside the root is read into a sandbox or written.
func TestPlantedSymlinksAreRefused(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	root, outside := shortRoot(t), t.TempDir()
	sb := createJSON(t, root, "--image", image)
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	mustOK(t, proc(t, root, "volume", "create", "vol", "--size", "16MiB"), "volume create")

	t.Run("snapshots/<id>", func(t *testing.T) {
		os.Mkdir(filepath.Join(outside, "snaps"), 0o700)
		link := filepath.Join(root, "snapshots", sb.ID)
		os.MkdirAll(filepath.Dir(link), 0o700)
		if err := os.Symlink(filepath.Join(outside, "snaps"), link); err != nil {
			t.Fatal(err)
		}
		before := treeDigest(t, outside)
		refusedOneLine(t, bounded(t, root, "snapshot", sb.ID), "symbolic link")
		if treeDigest(t, outside) != before {
			t.Fatal("snapshot wrote outside the state root")
		}
		os.Remove(link)
	})
	t.Run("disks/<id>-workspace.ext4", func(t *testing.T) {
		ws := filepath.Join(root, "disks", sb.ID+"-workspace.ext4")
		replaceWithLink(t, ws, filepath.Join(outside, "ws.ext4"))
		before := treeDigest(t, outside)
		refusedOneLine(t, bounded(t, root, "start", sb.ID), "symbolic link")
		if treeDigest(t, outside) != before {
			t.Fatal("start wrote outside the state root")
		}
		os.Remove(ws)
		os.Rename(filepath.Join(outside, "ws.ext4"), ws)
	})
	for _, logName := range []string{sb.ID + ".vmm.log", sb.ID + ".supervisor.log"} {
		t.Run("logs/"+logName, func(t *testing.T) {
			log := filepath.Join(root, "logs", logName)
			replaceWithLink(t, log, filepath.Join(outside, logName))
			before := treeDigest(t, outside)
			refusedOneLine(t, bounded(t, root, "start", sb.ID), "symbolic link")
			if treeDigest(t, outside) != before {
				t.Fatal("start wrote a log outside the state root")
			}
			os.Remove(log)
			os.Rename(filepath.Join(outside, logName), log)
		})
	}
	t.Run("logs/", func(t *testing.T) {
		logs := filepath.Join(root, "logs")
		replaceWithLink(t, logs, filepath.Join(outside, "logs"))
		before := treeDigest(t, outside)
		refusedOneLine(t, bounded(t, root, "start", sb.ID), "symbolic link")
		refusedOneLine(t, bounded(t, root, "create", "--image", image), "symbolic link")
		if treeDigest(t, outside) != before {
			t.Fatal("a command wrote into logs/ outside the state root")
		}
		os.Remove(logs)
		os.Rename(filepath.Join(outside, "logs"), logs)
	})
	t.Run("volumes/<v>", func(t *testing.T) {
		vol := filepath.Join(root, "volumes", "vol")
		replaceWithLink(t, vol, filepath.Join(outside, "vol"))
		os.Remove(filepath.Join(outside, "vol", ".lock")) // so a lock created through the link shows
		before := treeDigest(t, outside)
		refusedOneLine(t, bounded(t, root, "volume", "rm", "--yes", "vol"), "symbolic link")
		refusedOneLine(t, bounded(t, root, "create", "--image", image, "--volume", "vol:/data"), "symbolic link")
		if treeDigest(t, outside) != before {
			t.Fatal("a volume command wrote outside the state root")
		}
		if _, err := os.Stat(filepath.Join(outside, "vol", "disk.ext4")); err != nil {
			t.Fatalf("the linked volume's disk is gone: %v", err)
		}
	})
	// The derived record is rewritten after every start and stop; with
	// sandboxes/<id> a link, the commands still work (the record is only
	// derived) but nothing is written where the link points.
	t.Run("sandboxes/<id>", func(t *testing.T) {
		dir := filepath.Join(root, "sandboxes", sb.ID)
		replaceWithLink(t, dir, filepath.Join(outside, "record"))
		os.Remove(filepath.Join(outside, "record", "record.json")) // so a write through the link shows
		before := treeDigest(t, outside)
		mustOK(t, bounded(t, root, "start", sb.ID), "start with a linked record dir")
		mustOK(t, bounded(t, root, "stop", sb.ID), "stop with a linked record dir")
		if treeDigest(t, outside) != before {
			t.Fatal("the record was written outside the state root")
		}
		os.Remove(dir)
		os.Rename(filepath.Join(outside, "record"), dir)
	})
	// With every plant but the volume's removed, the sandbox starts again.
	mustOK(t, bounded(t, root, "start", sb.ID), "start after the links are gone")
}
