package lifecycle

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/sagas"
)

func TestVolumeCreateAndItsRefusals(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	v, err := f.m.VolumeCreate(f.ctx, "data", 8<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "data" || v.SizeBytes != 8<<20 || !f.exists("volumes/data/disk.ext4") || !f.exists("volumes/data/data") {
		t.Fatalf("volume %+v, files %v", v, f.files("volumes"))
	}
	if got := types(f.j.since(0)); !reflect.DeepEqual(got, []string{"volume.created"}) {
		t.Fatalf("volume create journaled %v", got)
	}
	os.MkdirAll(filepath.Join(f.root, "volumes", "stray"), 0o700)
	cases := []struct {
		name, vol string
		size      int64
		says      string
	}{
		{"bad name", "Data!", 8 << 20, `volume name "Data!"`},
		{"too small", "small", 8<<20 - 1, "at least 8 MiB"},
		{"exists", "data", 8 << 20, `volume "data" exists`},
		{"a directory the journal does not know", "stray", 8 << 20, "move it aside first"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mark := f.j.mark()
			_, err := f.m.VolumeCreate(f.ctx, c.vol, c.size, nil)
			wantErr(t, err, ErrRefused, c.says)
			if f.j.mark() != mark {
				t.Fatalf("a refused volume create journaled %v", types(f.j.since(mark)))
			}
		})
	}
	if !f.exists("volumes/stray") {
		t.Fatal("a refused create removed a directory it did not make")
	}
}

// A volume attached at create is detached by rm, which never touches its
// files; volume rm refuses while a sandbox has it, and deletes it once
// none does (the only path that deletes volume data).
func TestVolumeAttachDetachAndRemove(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	for _, name := range []string{"data", "spare"} {
		if _, err := f.m.VolumeCreate(f.ctx, name, 8<<20, nil); err != nil {
			t.Fatal(err)
		}
	}
	mark := f.j.mark()
	sb := f.create(CreateSpec{Volumes: []Mount{{"data", "/data"}}})
	if got := ofType(f.j.since(mark), events.VolumeAttached); len(got) != 1 || got[0].Payload.(events.VolumeAttachedEvent).GuestPath != "/data" {
		t.Fatalf("create attached %v", got)
	}
	_, err := f.m.Create(f.ctx, CreateSpec{Image: sb.Image, Volumes: []Mount{{"data", "/data"}}})
	wantErr(t, err, ErrRefused, "a writable volume is never shared")
	_, err = f.m.Create(f.ctx, CreateSpec{Image: sb.Image, Volumes: []Mount{{"spare", "data"}}})
	wantErr(t, err, ErrRefused, "is not absolute")
	// The guest path travels on the kernel command line, split on spaces.
	_, err = f.m.Create(f.ctx, CreateSpec{Image: sb.Image, Volumes: []Mount{{"spare", "/my data"}}})
	wantErr(t, err, ErrRefused, "white space")

	_, err = f.m.VolumeRemovePlan(f.ctx, "data")
	wantErr(t, err, ErrRefused, "it is attached to "+sb.ID)
	err = f.m.VolumeRemove(f.ctx, "data")
	wantErr(t, err, ErrRefused, "it is attached to "+sb.ID)

	mark = f.j.mark()
	if _, err := f.m.RemoveWith(f.ctx, sb.ID, RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if got := ofType(f.j.since(mark), events.VolumeDetached); len(got) != 1 {
		t.Fatalf("rm detached %v", got)
	}
	if !f.exists("volumes/data/disk.ext4") {
		t.Fatal("rm deleted the volume's files")
	}
	if v, err := f.m.VolumeRemovePlan(f.ctx, "data"); err != nil || v.Name != "data" {
		t.Fatalf("plan: %+v, %v", v, err)
	}
	mark = f.j.mark()
	if err := f.m.VolumeRemove(f.ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if got := types(f.j.since(mark)); !reflect.DeepEqual(got, []string{"saga.started", "volume.removed", "saga.finished"}) {
		t.Fatalf("volume rm journaled %v", got)
	}
	if f.exists("volumes/data") {
		t.Fatal("volume rm left its files")
	}
	wantErr(t, f.m.VolumeRemove(f.ctx, "data"), ErrNotFound, `no volume "data"`)
	_, err = f.m.VolumeRemovePlan(f.ctx, "data")
	wantErr(t, err, ErrNotFound, `no volume "data"`)
}

// prune clears attachments naming a sandbox that no longer exists and,
// asked, deletes volumes nothing uses, but only those named after a dry run.
func TestVolumePrune(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	for _, name := range []string{"stale", "free", "used"} {
		if _, err := f.m.VolumeCreate(f.ctx, name, 8<<20, nil); err != nil {
			t.Fatal(err)
		}
	}
	sb := f.create(CreateSpec{Volumes: []Mount{{"used", "/u"}}})
	// An attachment of a sandbox the journal no longer has (an older
	// nexus's journal could leave one).
	gone := ulid.Make().String()
	e := events.New(ulid.Make(), time.Now(), gone, events.VolumeAttachedEvent{Name: "stale", GuestPath: "/s"})
	if _, err := f.j.AppendExpect(f.ctx, []core.Expect{}, e); err != nil {
		t.Fatal(err)
	}
	mark := f.j.mark()
	dry, err := f.m.VolumePrune(f.ctx, false, true)
	if err != nil || !slices.Equal(dry.Stale, []string{"stale@" + gone}) || !slices.Equal(dry.Detached, []string{"free", "stale"}) || len(dry.Removed) != 0 || f.j.mark() != mark {
		t.Fatalf("dry run %+v, %v (journaled %v)", dry, err, types(f.j.since(mark)))
	}
	rep, err := f.m.VolumePrune(f.ctx, true, true, "stale")
	if err != nil || !slices.Equal(rep.Removed, []string{"stale"}) {
		t.Fatalf("prune --apply of stale: %+v, %v", rep, err)
	}
	if !f.exists("volumes/free") || f.exists("volumes/stale") || !f.exists("volumes/used") {
		t.Fatalf("volumes left %v: want free and used kept", f.files("volumes"))
	}
	if vols, _ := f.m.Volumes(f.ctx); len(vols) != 2 || len(vols[1].AttachedTo) != 1 || vols[1].AttachedTo[0] != sb.ID {
		t.Fatalf("volumes %+v", vols)
	}
}

// A volume rm killed mid-delete is finished forward by recover (the saga
// names its volume in its one step), never undone: the journal never lists
// a volume whose files are half gone.
func TestRecoverFinishesAnInterruptedVolumeRemove(t *testing.T) {
	t.Parallel()
	for _, phase := range []sagas.Phase{sagas.BeforeRecord, sagas.AfterRecord} {
		t.Run(string(phase), func(t *testing.T) {
			f := newFlow(t)
			if _, err := f.m.VolumeCreate(f.ctx, "data", 8<<20, nil); err != nil {
				t.Fatal(err)
			}
			f.crashAt(events.SagaVolumeRm, volumeRmStep+"data", phase, func() { f.m.VolumeRemove(f.ctx, "data") })
			rep := f.recover()
			if len(rep.Resumed) != 1 || f.exists("volumes/data") {
				t.Fatalf("recover %+v, volumes %v: want the delete finished", rep, f.files("volumes"))
			}
			if vols, _ := f.m.Volumes(f.ctx); len(vols) != 0 {
				t.Fatalf("volumes %+v after the recovered rm", vols)
			}
		})
	}
}
