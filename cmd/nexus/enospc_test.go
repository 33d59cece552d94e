package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/host/smallfs"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestFullDisk fills the real filesystem under a state root, with a daemon
// and without: writes are refused with one line naming the filesystem,
// reads keep being answered, rm and reap still work (they free space), and
// once space is freed writes work again, through the same daemon process.
func TestFullDisk(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Run("daemon", func(t *testing.T) { fullDisk(t, true) })
	t.Run("local", func(t *testing.T) { fullDisk(t, false) })
}

func fullDisk(t *testing.T, withDaemon bool) {
	mnt := smallfs.Mount(t, 256<<20) // reserve 16 MiB, floor 2 MiB
	root := filepath.Join(mnt, "root")
	image := makeImage(t)
	var d *testutil.Proc
	if withDaemon {
		d = startDaemon(t, root)
	}
	a := createJSON(t, root, "--image", image)
	b := createJSON(t, root, "--image", image)
	eventsBefore := strings.Count(mustOK(t, nexus(t, root, "events", "--all", "-q"), "events").stdout, "\n")

	filler := smallfs.Fill(t, mnt, 8<<20)
	defer os.Remove(filler)
	wantFailure(t, proc(t, root, "stop", a.ID), 1, "no space left on the filesystem mounted at "+mnt+" ")
	wantFailure(t, proc(t, root, "create", "--image", image, "--force"), 1, "no space left on the filesystem mounted at "+mnt+" ")

	// Reads (through the daemon that refused the writes, if one runs).
	list := sandboxes(t, root)
	if len(list) != 2 {
		t.Fatalf("ls on a full disk lists %d sandboxes, want 2", len(list))
	}
	if sb := inspectJSON(t, root, a.ID); sb.State != projections.StateRunning {
		t.Fatalf("inspect on a full disk: %+v", sb)
	}
	if n := strings.Count(mustOK(t, nexus(t, root, "events", "--all", "-q"), "events").stdout, "\n"); n != eventsBefore {
		t.Fatalf("events on a full disk: %d lines, want the %d from before the refusals", n, eventsBefore)
	}

	// rm frees space on the nearly full disk.
	freeBefore := smallfs.Free(t, mnt)
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", b.ID), "rm on a nearly full disk")
	if freeAfter := smallfs.Free(t, mnt); freeAfter <= freeBefore {
		t.Fatalf("rm freed nothing: %d bytes free before, %d after", freeBefore, freeAfter)
	}
	for _, r := range b.Resources {
		if p := filepath.Join(root, r.Path); exists(p) {
			t.Fatalf("rm left %s", p)
		}
	}
	// So does reap --apply.
	filler2 := smallfs.Fill(t, mnt, 8<<20)
	defer os.Remove(filler2)
	_, planted := orphansOf(t, root)
	// A process that exits while the reaper scans /proc makes that pass
	// inconclusive, and the reaper then keeps what it could not judge (in
	// the plan or at apply): right for the reaper, so the test asks again
	// (testutil.ReapUntilConclusive) and requires each pass that kept a
	// planted orphan to say it was unsure.
	testutil.ReapUntilConclusive(t, "reap --apply --plan on a nearly full disk", func() (bool, string) {
		var plan struct {
			Plan string `json:"plan"`
		}
		json.Unmarshal([]byte(mustOK(t, nexus(t, root, "reap", "--json"), "reap dry run on a nearly full disk").stdout), &plan)
		rr := mustOK(t, nexus(t, root, "reap", "--apply", "--plan", plan.Plan), "reap --apply --plan on a nearly full disk")
		left := ""
		for _, p := range planted {
			if exists(p) {
				left = p
				break
			}
		}
		if left == "" {
			return false, ""
		}
		// "not in plan": the dry run's own scan was the inconclusive one.
		if !strings.Contains(rr.stdout, testutil.ProcInconclusive) && !strings.Contains(rr.stdout, "not in plan") {
			t.Fatalf("reap --apply left %s:\n%s", left, rr.stdout)
		}
		return true, rr.stdout
	})
	// Below the floor nothing is admitted, not even rm.
	filler3 := smallfs.Fill(t, mnt, 1<<20)
	defer os.Remove(filler3)
	wantFailure(t, proc(t, root, "rm", "-f", "--with-snapshots", a.ID), 1, "even rm, reap and recover need")

	// Space freed: the same daemon takes writes again.
	for _, f := range []string{filler, filler2, filler3} {
		os.Remove(f)
	}
	mustOK(t, proc(t, root, "stop", a.ID), "stop after space was freed")
	c := createJSON(t, root, "--image", image)
	if d != nil {
		st, err := control.NewClient(filepath.Join(root, wire.SocketName)).Status(context.Background())
		if err != nil || st.Pid != d.Cmd.Process.Pid {
			t.Fatalf("the daemon answering is %+v (%v), want the one started before the disk filled (pid %d)", st, err, d.Cmd.Process.Pid)
		}
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", a.ID), "rm")
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", c.ID), "rm")
	if out := mustOK(t, nexus(t, root, "replay", "verify"), "replay verify").stdout; !strings.Contains(out, "unfinished sagas: 0") {
		t.Fatalf("replay verify: %s", out)
	}
}

// TestPreflightKnowsReflink: on XFS with reflink=1 a create's OS disk and
// cache entry are FICLONEs that allocate no data blocks, so the preflight
// charges them nothing: with less free space than two copies (a miss) or
// one copy (a hit) of the image's data, creates are admitted and indeed
// use almost none of it. An image on another filesystem cannot be
// reflinked, and the same create is refused. A fork's children, reflinks
// of the parent's disks, are admitted the same way.
func TestPreflightKnowsReflink(t *testing.T) {
	testutil.StartsSandboxes(t)
	mnt := smallfs.MountXFS(t, 1<<30)
	root := filepath.Join(mnt, "root")
	t.Cleanup(func() { testutil.KillProcessesUnder(root) }) // before the unmount
	image := filepath.Join(mnt, "base.raw")
	f, err := os.Create(image)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*13 + 5)
	}
	for i := 0; i < 200; i++ {
		if _, err := f.WriteAt(chunk, int64(i)*(2<<20)); err != nil {
			t.Fatal(err)
		}
	}
	f.Truncate(1 << 30)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	const data = 200 << 20
	mustOK(t, nexus(t, root, "ls"), "ls") // the journal's own blocks first

	filler := smallfs.Fill(t, mnt, data+data/2) // < entry + disk
	free := smallfs.Free(t, mnt)
	a := createJSON(t, root, "--image", image)
	if used := free - smallfs.Free(t, mnt); used > data/2 {
		t.Fatalf("a create by reflink used %d bytes", used)
	}
	// A second filler, not a smaller one: XFS frees a removed file's blocks
	// in the background, so removing the first would race the measure.
	filler2 := smallfs.Fill(t, mnt, data/2) // < one copy
	defer os.Remove(filler2)
	createJSON(t, root, "--image", image)
	// A fork's children are reflinks of the parent's disks too.
	mustOK(t, proc(t, root, "fork", a.ID, "--count", "3"), "fork --count 3 by reflink")

	// The same data on another filesystem: two real copies, refused.
	other := filepath.Join(t.TempDir(), "other.raw")
	if out, err := exec.Command("cp", "--sparse=always", image, other).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	wantFailure(t, proc(t, root, "create", "--image", other), 1, "insufficient disk space")
	mustOK(t, proc(t, root, "rm", "-f", a.ID), "rm")
	os.Remove(filler)
}
