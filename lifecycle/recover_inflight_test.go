package lifecycle

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/sagalease"
	"github.com/nexus-sandbox/nexus/projections"
)

// appendStopped journals n committed, stopped sandboxes (each owning a
// disk that is not there: recover has no reason to look at them).
func (f *flow) appendStopped(n int) []string {
	f.t.Helper()
	var ids []string
	var evs []events.Event
	for range n {
		id := ulid.Make().String()
		ids = append(ids, id)
		evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "img", Driver: "process",
			Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}}}))
	}
	if _, err := f.j.Append(f.ctx, evs...); err != nil {
		f.t.Fatal(err)
	}
	return ids
}

// leaseFiles lists leases/.
func (f *flow) leaseFiles() []string {
	f.t.Helper()
	entries, err := os.ReadDir(filepath.Join(f.root, sagalease.Dir))
	if err != nil && !os.IsNotExist(err) {
		f.t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// Recover costs what is in flight: of a root's stopped sandboxes with no
// open saga and no recorded process it checks none, and it checks the one
// that records a (dead) VMM. An old root's lease files, one per sandbox
// recover ever visited, are cleared, and leases/ stays empty after.
func TestRecoverChecksOnlyWhatIsInFlight(t *testing.T) {
	f := newFlow(t)
	stopped := f.appendStopped(40)
	if err := os.MkdirAll(filepath.Join(f.root, sagalease.Dir), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, id := range stopped {
		if err := os.WriteFile(sagalease.Path(f.root, "sandbox/"+id), []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rep := f.recover()
	if rep.Checked != 0 || len(rep.Stopped) != 0 {
		t.Fatalf("recover checked %d of %d stopped sandboxes (%+v), want none", rep.Checked, len(stopped), rep)
	}
	if rep.Leases != len(stopped) {
		t.Fatalf("recover cleared %d lease files, want the old root's %d", rep.Leases, len(stopped))
	}
	if left := f.leaseFiles(); len(left) != 0 {
		t.Fatalf("leases/ holds %v after recover", left)
	}

	// One sandbox records a VMM that is gone (pid 1 never has these start
	// ticks): recover checks it alone, and stops it.
	gone := f.appendStopped(1)[0]
	if _, err := f.j.Append(f.ctx, events.New(ulid.Make(), time.Now(), gone, events.SandboxStartedEvent{Driver: "process", VMMPid: 1, VMMStart: 1})); err != nil {
		t.Fatal(err)
	}
	rep = f.recover()
	if rep.Checked != 1 || !slices.Equal(rep.Stopped, []string{gone}) {
		t.Fatalf("recover checked %d and stopped %v, want %s alone", rep.Checked, rep.Stopped, gone)
	}
	if sb, _ := f.find(gone); sb.State != projections.StateStopped || sb.VMM != nil {
		t.Fatalf("after recover: %+v", sb)
	}
	if rep = f.recover(); rep.Checked != 0 {
		t.Fatalf("a second recover checked %d sandboxes, want none", rep.Checked)
	}
	if left := f.leaseFiles(); len(left) != 0 {
		t.Fatalf("leases/ holds %v after recover", left)
	}
}

// Commands leave no lease file behind: after create, stop, start and rm,
// leases/ holds nothing (no saga is running).
func TestCommandsLeaveNoLeaseFiles(t *testing.T) {
	f := newFlow(t)
	sb := f.create(CreateSpec{Handle: "a"})
	check := func(after string) {
		t.Helper()
		if left := f.leaseFiles(); len(left) != 0 {
			t.Fatalf("leases/ holds %v after %s", left, after)
		}
	}
	check("create")
	if _, err := f.m.Stop(f.ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	check("stop")
	if err := f.m.Remove(f.ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	check("rm")
}

// Recover's sweep of intents the journal never heard of reads disks/ only
// when a runner died (its lease file is left), and then by name, parsing
// only what can be an intent: of a root whose stopped sandboxes have their
// disks on disk, it judges the one dead staged intent and the one
// journaled sandbox's create intent, not the disks.
func TestRecoverParsesOnlyIntentNames(t *testing.T) {
	f := newFlow(t)
	ids := f.appendStopped(60)
	if err := os.MkdirAll(f.m.Root.Disks(), 0o700); err != nil {
		t.Fatal(err)
	}
	plant := func(p string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(`{"sandbox":"x"}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		plant(f.m.Root.RawDisk(id))
		plant(f.m.Root.WorkspaceDisk(id))
	}
	known := f.m.Root.CreateIntent(ids[0])
	plant(known)
	staged := filepath.Join(f.m.Root.Disks(), "."+ulid.Make().String()+".create-intent.json.stage-7")
	plant(staged)
	// No runner died: disks/ is not read at all.
	if rep := f.recover(); rep.disksRead != 0 || rep.intentsParsed != 0 || len(rep.Intents) != 0 {
		t.Fatalf("recover with no runner's lease file left read disks/ %d times, parsed %d names, swept %v; want none",
			rep.disksRead, rep.intentsParsed, rep.Intents)
	}
	leaveRunnerTrace(t, f.root, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(staged), "."), ".create-intent.json.stage-7"))
	rep := f.recover()
	if rep.disksRead != 1 || rep.intentsParsed != 2 {
		t.Fatalf("recover's intent sweep parsed %d names of disks/, want the 2 intents (of %d entries)", rep.intentsParsed, 2*len(ids)+2)
	}
	if !slices.Equal(rep.Intents, []string{filepath.Base(staged)}) {
		t.Fatalf("recover swept %v, want the dead staged intent alone", rep.Intents)
	}
	if _, err := os.Lstat(known); err != nil {
		t.Fatalf("a journaled sandbox's create intent: %v", err)
	}
	if left := f.leaseFiles(); len(left) != 0 || rep.Leases != 1 {
		t.Fatalf("after the sweep leases/ holds %v (%d cleared), want the dead runner's file followed and removed", left, rep.Leases)
	}
	if rep := f.recover(); rep.disksRead != 0 {
		t.Fatalf("the next recover read disks/ again (%d)", rep.disksRead)
	}
}
