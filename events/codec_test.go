package events

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
)

var (
	testID      = ulid.MustParse("01JDQ4Z6X1M9A3Y0C5TB2R8NKV")
	testSandbox = "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"
	testTime    = time.Date(2026, 12, 3, 9, 0, 0, 123456789, time.UTC)
)

// samples holds one non-trivial payload per registered type, so a new type
// without a sample fails TestEveryTypeRoundTrips.
var samples = []Payload{
	SandboxCreatedEvent{Handle: "dev/a", Image: "base.raw", Driver: "process", Resources: []Resource{{KindRawDisk, "disks/x.raw"}}, Bootstrap: Bootstrap{CacheID: "img-1", Identity: "stat-sha256:ab"},
		Boot: BootConfig{Kernel: "/boot/vmlinuz", Initramfs: "/boot/initrd", Cmdline: "console=ttyS0", Cpus: 2, MemoryBytes: 1 << 30}, Labels: Labels{"team": "web"}},
	SandboxForkedEvent{Parent: testSandbox, Image: "base.raw", Driver: "process", Resources: []Resource{{KindWorkspaceDisk, "disks/y-workspace.ext4"}}, Bootstrap: Bootstrap{CacheID: "img-1"}, Boot: BootConfig{Cpus: 2}},
	SandboxRestoredEvent{Snapshot: "s1", Source: testSandbox, Image: "i", Driver: "process", Bootstrap: Bootstrap{CacheID: "img-1", Identity: "stat-sha256:ab"}, Boot: BootConfig{MemoryBytes: 1 << 30}},
	SandboxStartedEvent{Driver: "process", VMMPid: 42, VMMStart: 9000, Sockets: []Resource{{KindAPISocket, "run/sb-x.sock"}}},
	SandboxReadyEvent{Run: "01J0RUN", By: "agent", BootAtMs: 1700000000000, ReadyAtMs: 1700000009000},
	SandboxNotReadyEvent{Run: "01J0RUN", Reason: "AgentNotReady", Message: "no answer", WaitedMs: 180000},
	SandboxStoppedEvent{Reason: "user"},
	SandboxFailedEvent{Reason: "OverlayDiskFull", Message: "no space"},
	SandboxRemovedEvent{},
	SandboxRenamedEvent{Old: "dev/a", Handle: "dev/b"},
	DiskMaterialisedEvent{Resource: Resource{KindRawDisk, "disks/x.raw"}, Method: "reflink", AllocatedBytes: 4096, ApparentBytes: 1 << 30},
	IntentWrittenEvent{Resource: Resource{KindCreateIntent, "disks/x.create-intent.json"}, Covers: []string{"disks/x.raw"}},
	IntentRetiredEvent{Resource: Resource{KindCreateIntent, "disks/x.create-intent.json"}},
	SupervisorStartedEvent{Pid: 7, Start: 11, Socket: "supervisors/x/supervisor.sock", StateDir: Resource{KindSupervisorState, "supervisors/x"}},
	SupervisorStoppedEvent{Pid: 7, Reason: "rm"},
	SupervisorExitedEvent{Pid: 7, StartTicks: 11, Status: ExitUnknown, By: "daemon"},
	VMMExitedEvent{Pid: 42, StartTicks: 9000, Status: ExitKilled, Code: 9, Signal: "SIGKILL", By: "daemon"},
	SnapshotTakenEvent{SnapshotID: "s1", Dir: Resource{KindSnapshot, "snapshots/x/s1"}, AllocatedBytes: 10},
	VolumeCreatedEvent{Name: "data", Path: "volumes/data/disk.ext4", SizeBytes: 1 << 20},
	VolumeAttachedEvent{Name: "data", GuestPath: "/data", ReadOnly: true},
	VolumeDetachedEvent{Name: "data"},
	VolumeRemovedEvent{Name: "data"},
	FlushPendingEvent{Run: "r2", Previous: "r1", PreviousFlushed: "r1", Overlay: "disks/x-workspace.ext4"},
	FlushAcknowledgedEvent{Run: "r1", Overlay: "disks/x-workspace.ext4"},
	FlushRestoredEvent{Run: "r2", Previous: "r1", PreviousFlushed: "r1"},
	OverlayRecoveredEvent{Overlay: "o", OldBytes: 1, NewBytes: 2, FreeBefore: 0, FreeAfter: 5},
	WarningRaisedEvent{Reason: "OverlayDiskFull", Message: "grown by 64 MiB"},
	ReapDecidedEvent{Plan: "p", Part: 1, Parts: 1, Scanned: 3, Owned: 2, Entries: []ReapEntry{{Kind: KindRawDisk, Path: "disks/x.raw", Verdict: "orphan", Reason: "no owner", Allocated: 4096}}},
	ReapAppliedEvent{Plan: "p", Part: 1, Parts: 1, Deleted: []ReapEntry{{Kind: KindRawDisk, Path: "disks/x.raw", Verdict: "orphan", Reason: "no owner"}}, Failed: []ReapEntry{{Kind: KindAPISocket, Path: "run/sb-x.sock", Verdict: "orphan", Reason: "r", Error: "EBUSY"}}},
	ResourceCreatedEvent{Resource: Resource{KindSupervisorState, "supervisors/x"}},
	ResourceReclaimedEvent{Resource: Resource{KindRawDisk, "disks/x.raw"}, By: "reap", AllocatedBytes: 4096},
	RunSweptEvent{RunID: "r", Verdict: "sweep", Reason: "owner gone", Pid: 3, Driver: "process", By: "init", Removed: []string{"a"}, NotFound: []string{"b"}, Networks: []string{"n"}},
	RunKeptEvent{By: "init", Sweeper: "s", Driver: "process", AtMs: 7, Part: 1, Parts: 1, Kept: []KeptRuns{{Reason: "owner alive", Runs: []string{"a", "b"}}}},
	ImageCachePreparedEvent{CacheID: "c", Ref: "img:1", Identity: "sha256:x", Layout: 1, Path: "images/c"},
	ImageCacheUsedEvent{CacheID: "c", LastUseMs: 5},
	ImageCachePrunedEvent{CacheID: "c", AllocatedBytes: 5},
	MirrorCreatedEvent{Stream: "NEXUS_HOST_A", Domain: "fleet", Replicas: 3},
	MirrorRecreatedEvent{Stream: "NEXUS_HOST_A", Domain: "fleet", Replicas: 1},
	MirrorLinkedEvent{Stream: "NEXUS_HOST_A", URLs: []string{"nats-leaf://u:xxxxx@n1:7422"}, Flaps: 2},
	MirrorUnlinkedEvent{Stream: "NEXUS_HOST_A", URLs: []string{"nats-leaf://n1:7422"}},
	MirrorSettingsDifferEvent{Stream: "NEXUS_HOST_A", Kept: "replicas 1 (nexus asks 3)"},
	MirrorRefusedEvent{Stream: "NEXUS_HOST_A", Reason: "another host's"},
	JournalDigestEvent{Seq: 7, Digest: "00"},
	SagaStartedEvent{Kind: "create", Steps: []string{"intent", "disk", "commit"}},
	SagaFinishedEvent{},
	SagaCompensatedEvent{Reason: "ENOSPC"},
	HandleClaimedEvent{Sandbox: testSandbox, Handle: "web/1"},
}

func TestEveryTypeRoundTrips(t *testing.T) {
	seen := map[Type]bool{}
	for _, p := range samples {
		e := New(testID, testTime, testSandbox, p).InSaga("saga-1", "commit")
		data, err := Encode(e)
		if err != nil {
			t.Fatalf("encode %s: %v", p.EventType(), err)
		}
		got, err := Decode(data)
		if err != nil {
			t.Fatalf("decode %s: %v", p.EventType(), err)
		}
		if !reflect.DeepEqual(got, e) {
			t.Errorf("%s: round trip\n got %+v\nwant %+v", p.EventType(), got, e)
		}
		seen[p.EventType()] = true
	}
	for _, typ := range Types() {
		if !seen[typ] {
			t.Errorf("type %s has no sample in this test", typ)
		}
	}
}

func rawEvent(t *testing.T, w wire) []byte {
	t.Helper()
	if w.Format == 0 {
		w.Format = EnvelopeFormat
	}
	if w.ID == nil {
		w.ID = testID[:]
	}
	data, err := msgpack.Marshal(&w)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func payloadBytes(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeRefusesWhatItCannotRead(t *testing.T) {
	good := payloadBytes(t, SandboxRemovedEvent{})
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"unknown type", rawEvent(t, wire{Type: "sandbox.teleported", Schema: 1, Payload: good}), ErrUnknownType},
		{"newer payload schema", rawEvent(t, wire{Type: string(SandboxRemoved), Schema: 2, Payload: good}), ErrSchemaTooNew},
		{"newer envelope", rawEvent(t, wire{Format: EnvelopeFormat + 1, Type: string(SandboxRemoved), Schema: 1, Payload: good}), ErrSchemaTooNew},
		{"schema zero", rawEvent(t, wire{Type: string(SandboxRemoved), Schema: 0, Payload: good}), ErrMalformed},
		{"short id", rawEvent(t, wire{ID: []byte{1, 2}, Type: string(SandboxRemoved), Schema: 1, Payload: good}), ErrMalformed},
		{"long id", rawEvent(t, wire{ID: make([]byte, 17), Type: string(SandboxRemoved), Schema: 1, Payload: good}), ErrMalformed},
		{"unknown type of a long name", rawEvent(t, wire{Type: strings.Repeat("sandbox.", 8) + "teleported", Schema: 1, Payload: good}), ErrUnknownType},
		{"unknown envelope field", payloadBytes(t, map[string]any{"f": 1, "id": testID[:], "t": string(SandboxRemoved), "v": 1, "ts": 1, "p": msgpack.RawMessage(good), "surprise-field": 1}), ErrMalformed},
		{"unknown payload field", rawEvent(t, wire{Type: string(SandboxRemoved), Schema: 1, Payload: payloadBytes(t, map[string]int{"surprise": 1})}), ErrMalformed},
		{"payload of wrong shape", rawEvent(t, wire{Type: string(SandboxStopped), Schema: 1, Payload: payloadBytes(t, []int{1, 2})}), ErrMalformed},
		{"not msgpack", []byte("{\"json\": true}"), ErrMalformed},
		{"empty", nil, ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(c.data)
			if !errors.Is(err, c.want) {
				t.Fatalf("Decode = %v, want %v", err, c.want)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T is not a *DecodeError", err)
			}
			// Whatever the envelope names is reported whole.
			if strings.HasPrefix(c.name, "unknown type") && !strings.HasSuffix(string(de.Type), ".teleported") ||
				strings.HasPrefix(c.name, "unknown envelope field") && !strings.Contains(err.Error(), `"surprise-field"`) {
				t.Fatalf("Decode = %v (type %q)", err, de.Type)
			}
		})
	}
}

func TestDecodeTruncatedNeverPanics(t *testing.T) {
	data, err := Encode(New(testID, testTime, testSandbox, samples[0]))
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(data); n++ {
		if _, err := Decode(data[:n]); err == nil {
			t.Fatalf("prefix of %d/%d bytes decoded without error", n, len(data))
		}
	}
}

func TestUpcastSandboxCreatedV1(t *testing.T) {
	v1 := payloadBytes(t, sandboxCreatedV1{Handle: "h", Image: "img", Driver: "process", Disk: "disks/x.raw"})
	got, err := Decode(rawEvent(t, wire{Type: string(SandboxCreated), Schema: 1, Sandbox: testSandbox, Payload: v1}))
	if err != nil {
		t.Fatal(err)
	}
	want := SandboxCreatedEvent{Handle: "h", Image: "img", Driver: "process", Resources: []Resource{{KindRawDisk, "disks/x.raw"}}}
	if !reflect.DeepEqual(got.Payload, want) {
		t.Fatalf("upcast = %+v, want %+v", got.Payload, want)
	}
	if got.Schema != CurrentSchema(SandboxCreated) {
		t.Fatalf("upcast event reports schema %d, want the current %d", got.Schema, CurrentSchema(SandboxCreated))
	}
}

// TestUpcastAddedBootstrap: sandbox.created v2, sandbox.forked v1 and
// sandbox.restored v1 were
// written before the image cache; they decode with no bootstrap recorded,
// which prune reads as "protects every entry".
func TestUpcastAddedBootstrap(t *testing.T) {
	type createdV2 struct {
		Handle    string     `msgpack:"handle,omitempty"`
		Image     string     `msgpack:"image"`
		Driver    string     `msgpack:"driver"`
		Resources []Resource `msgpack:"resources"`
	}
	v2 := payloadBytes(t, createdV2{Image: "img", Driver: "process", Resources: []Resource{{KindRawDisk, "disks/x.raw"}}})
	got, err := Decode(rawEvent(t, wire{Type: string(SandboxCreated), Schema: 2, Sandbox: testSandbox, Payload: v2}))
	if err != nil {
		t.Fatal(err)
	}
	want := SandboxCreatedEvent{Image: "img", Driver: "process", Resources: []Resource{{KindRawDisk, "disks/x.raw"}}}
	if !reflect.DeepEqual(got.Payload, want) || !got.Payload.(SandboxCreatedEvent).Bootstrap.IsZero() {
		t.Fatalf("v2 upcast = %+v, want %+v", got.Payload, want)
	}
	type forkedV1 struct {
		Parent    string     `msgpack:"parent"`
		Image     string     `msgpack:"image"`
		Driver    string     `msgpack:"driver"`
		Resources []Resource `msgpack:"resources"`
	}
	v1 := payloadBytes(t, forkedV1{Parent: testSandbox, Image: "img", Driver: "process"})
	got, err = Decode(rawEvent(t, wire{Type: string(SandboxForked), Schema: 1, Sandbox: testSandbox, Payload: v1}))
	if err != nil {
		t.Fatal(err)
	}
	if f := got.Payload.(SandboxForkedEvent); f.Parent != testSandbox || !f.Bootstrap.IsZero() || got.Schema != CurrentSchema(SandboxForked) {
		t.Fatalf("forked v1 upcast = %+v (schema %d)", f, got.Schema)
	}
	type restoredV1 struct {
		Snapshot  string     `msgpack:"snapshot"`
		Source    string     `msgpack:"source"`
		Image     string     `msgpack:"image"`
		Driver    string     `msgpack:"driver"`
		Resources []Resource `msgpack:"resources"`
	}
	r1 := payloadBytes(t, restoredV1{Snapshot: "s", Source: testSandbox, Image: "img", Driver: "process"})
	got, err = Decode(rawEvent(t, wire{Type: string(SandboxRestored), Schema: 1, Sandbox: testSandbox, Payload: r1}))
	if err != nil {
		t.Fatal(err)
	}
	if r := got.Payload.(SandboxRestoredEvent); r.Snapshot != "s" || !r.Bootstrap.IsZero() || got.Schema != CurrentSchema(SandboxRestored) {
		t.Fatalf("restored v1 upcast = %+v (schema %d)", r, got.Schema)
	}
	// An unrecorded bootstrap is not written at all, so the bytes stay what
	// the previous schema would have produced.
	data, err := Encode(New(testID, testTime, testSandbox, want))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("bootstrap")) {
		t.Fatal("a zero bootstrap was encoded")
	}
}

// TestUpcastAddedBoot: sandbox.created v3 and sandbox.forked and
// sandbox.restored v2 were written before a sandbox recorded how it boots;
// they decode with no boot configuration, which a boot reads as "the
// booting command's settings, 1 vCPU and 512 MiB", as those boots ran.
func TestUpcastAddedBoot(t *testing.T) {
	type createdV3 struct {
		Handle    string     `msgpack:"handle,omitempty"`
		Image     string     `msgpack:"image"`
		Driver    string     `msgpack:"driver"`
		Resources []Resource `msgpack:"resources"`
		Bootstrap Bootstrap  `msgpack:"bootstrap,omitempty"`
	}
	v3 := payloadBytes(t, createdV3{Image: "img", Driver: "qemu", Bootstrap: Bootstrap{CacheID: "img-1"}})
	got, err := Decode(rawEvent(t, wire{Type: string(SandboxCreated), Schema: 3, Sandbox: testSandbox, Payload: v3}))
	if err != nil {
		t.Fatal(err)
	}
	if c := got.Payload.(SandboxCreatedEvent); c.Driver != "qemu" || c.Bootstrap.CacheID != "img-1" || !c.Boot.IsZero() || got.Schema != CurrentSchema(SandboxCreated) {
		t.Fatalf("created v3 upcast = %+v (schema %d)", c, got.Schema)
	}
	type forkedV2 struct {
		Parent    string     `msgpack:"parent"`
		Image     string     `msgpack:"image"`
		Driver    string     `msgpack:"driver"`
		Resources []Resource `msgpack:"resources"`
		Bootstrap Bootstrap  `msgpack:"bootstrap,omitempty"`
	}
	got, err = Decode(rawEvent(t, wire{Type: string(SandboxForked), Schema: 2, Sandbox: testSandbox, Payload: payloadBytes(t, forkedV2{Parent: testSandbox, Image: "img", Driver: "qemu"})}))
	if err != nil {
		t.Fatal(err)
	}
	if f := got.Payload.(SandboxForkedEvent); f.Driver != "qemu" || !f.Boot.IsZero() || got.Schema != CurrentSchema(SandboxForked) {
		t.Fatalf("forked v2 upcast = %+v (schema %d)", f, got.Schema)
	}
	type restoredV2 struct {
		Snapshot  string     `msgpack:"snapshot"`
		Source    string     `msgpack:"source"`
		Image     string     `msgpack:"image"`
		Driver    string     `msgpack:"driver"`
		Resources []Resource `msgpack:"resources"`
		Bootstrap Bootstrap  `msgpack:"bootstrap,omitempty"`
	}
	got, err = Decode(rawEvent(t, wire{Type: string(SandboxRestored), Schema: 2, Sandbox: testSandbox, Payload: payloadBytes(t, restoredV2{Snapshot: "s", Source: testSandbox, Image: "img", Driver: "qemu"})}))
	if err != nil {
		t.Fatal(err)
	}
	if r := got.Payload.(SandboxRestoredEvent); r.Driver != "qemu" || !r.Boot.IsZero() || got.Schema != CurrentSchema(SandboxRestored) {
		t.Fatalf("restored v2 upcast = %+v (schema %d)", r, got.Schema)
	}
	// An unrecorded boot configuration is not written at all.
	data, err := Encode(New(testID, testTime, testSandbox, SandboxCreatedEvent{Image: "img", Driver: "process"}))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("boot")) {
		t.Fatal("a zero boot configuration was encoded")
	}
}

// TestUpcastAddedLabels: sandbox.created v4, sandbox.forked and
// sandbox.restored v3 and volume.created v1 were written before labels;
// they decode with none, and no labels are encoded as no key at all.
func TestUpcastAddedLabels(t *testing.T) {
	type createdV4 struct {
		Handle    string     `msgpack:"handle,omitempty"`
		Image     string     `msgpack:"image"`
		Driver    string     `msgpack:"driver"`
		Resources []Resource `msgpack:"resources"`
		Bootstrap Bootstrap  `msgpack:"bootstrap,omitempty"`
		Boot      BootConfig `msgpack:"boot,omitempty"`
	}
	old := map[Type]any{
		SandboxCreated:  createdV4{Handle: "h", Image: "img", Driver: "qemu", Boot: BootConfig{Cpus: 2}},
		SandboxForked:   map[string]any{"parent": testSandbox, "image": "img", "driver": "qemu", "resources": []Resource{}, "boot": BootConfig{Cpus: 2}},
		SandboxRestored: map[string]any{"snapshot": "s", "source": testSandbox, "image": "img", "driver": "qemu", "resources": []Resource{}},
		VolumeCreated:   map[string]any{"name": "v", "path": "volumes/v/disk.ext4", "size": 1 << 20},
	}
	preLabels := map[Type]uint16{SandboxCreated: 4, SandboxForked: 3, SandboxRestored: 3, VolumeCreated: 1}
	for typ, p := range old {
		got, err := Decode(rawEvent(t, wire{Type: string(typ), Schema: preLabels[typ], Sandbox: testSandbox, Payload: payloadBytes(t, p)}))
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		var labels Labels
		switch p := got.Payload.(type) {
		case SandboxCreatedEvent:
			if p.Handle != "h" || p.Boot.Cpus != 2 {
				t.Fatalf("created upcast = %+v", p)
			}
			labels = p.Labels
		case SandboxForkedEvent:
			labels = p.Labels
		case SandboxRestoredEvent:
			labels = p.Labels
		case VolumeCreatedEvent:
			if p.SizeBytes != 1<<20 {
				t.Fatalf("volume upcast = %+v", p)
			}
			labels = p.Labels
		}
		if labels != nil || got.Schema != CurrentSchema(typ) {
			t.Fatalf("%s upcast: labels %v, schema %d", typ, labels, got.Schema)
		}
	}
	data, err := Encode(New(testID, testTime, testSandbox, SandboxCreatedEvent{Image: "img", Driver: "process"}))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("labels")) {
		t.Fatal("no labels were encoded as a key")
	}
	e := New(testID, testTime, testSandbox, SandboxCreatedEvent{Image: "img", Driver: "process", Labels: Labels{"team": "web"}})
	data, err = Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Decode(data)
	if err != nil || !reflect.DeepEqual(back.Payload, e.Payload) {
		t.Fatalf("labels round trip: %+v, %v", back.Payload, err)
	}
}

// TestUpcastAddedRoot: sandbox.created v5 and sandbox.forked and
// sandbox.restored v4 (and earlier) were written before a sandbox recorded how its root
// is made; they decode with Root empty, which is a private copy of the OS
// disk, as every sandbox had then.
func TestUpcastAddedRoot(t *testing.T) {
	type bootV4 struct {
		Kernel string `msgpack:"kernel,omitempty"`
		Cpus   int    `msgpack:"cpus,omitempty"`
	}
	type createdV4 struct {
		Image     string     `msgpack:"image"`
		Driver    string     `msgpack:"driver"`
		Resources []Resource `msgpack:"resources"`
		Boot      bootV4     `msgpack:"boot,omitempty"`
	}
	old := payloadBytes(t, createdV4{Image: "img", Driver: "qemu", Boot: bootV4{Kernel: "/k", Cpus: 2}})
	for _, tc := range []struct {
		typ    Type
		schema uint16
	}{{SandboxCreated, 4}, {SandboxForked, 3}, {SandboxRestored, 3}, {SandboxCreated, 5}, {SandboxForked, 4}, {SandboxRestored, 4}} {
		raw := old
		if tc.typ != SandboxCreated {
			type child struct {
				Parent    string     `msgpack:"parent,omitempty"`
				Snapshot  string     `msgpack:"snapshot,omitempty"`
				Source    string     `msgpack:"source,omitempty"`
				Image     string     `msgpack:"image"`
				Driver    string     `msgpack:"driver"`
				Resources []Resource `msgpack:"resources"`
				Boot      bootV4     `msgpack:"boot,omitempty"`
			}
			c := child{Image: "img", Driver: "qemu", Boot: bootV4{Kernel: "/k", Cpus: 2}}
			if tc.typ == SandboxForked {
				c.Parent = testSandbox
			} else {
				c.Snapshot, c.Source = "s", testSandbox
			}
			raw = payloadBytes(t, c)
		}
		got, err := Decode(rawEvent(t, wire{Type: string(tc.typ), Schema: tc.schema, Sandbox: testSandbox, Payload: raw}))
		if err != nil {
			t.Fatalf("%s v%d: %v", tc.typ, tc.schema, err)
		}
		var b BootConfig
		switch p := got.Payload.(type) {
		case SandboxCreatedEvent:
			b = p.Boot
		case SandboxForkedEvent:
			b = p.Boot
		case SandboxRestoredEvent:
			b = p.Boot
		}
		if b.Kernel != "/k" || b.Cpus != 2 || b.Root != "" || b.RootMode() != RootCopy || got.Schema != CurrentSchema(tc.typ) {
			t.Fatalf("%s v%d upcast: boot %+v (root mode %s), schema %d", tc.typ, tc.schema, b, b.RootMode(), got.Schema)
		}
	}
}

func TestEncodeRefusesMismatchedPayload(t *testing.T) {
	e := New(testID, testTime, "", SandboxRemovedEvent{})
	e.Payload = SandboxStoppedEvent{}
	if _, err := Encode(e); err == nil {
		t.Fatal("encoded a sandbox.removed envelope around a sandbox.stopped payload")
	}
	e = New(testID, testTime, "", SandboxRemovedEvent{})
	e.Schema = 1
	e.Type = SandboxCreated
	if _, err := Encode(e); err == nil {
		t.Fatal("encoded with a payload of another type")
	}
}

func TestSubjects(t *testing.T) {
	got, err := Subject(SandboxCreated, testSandbox)
	if err != nil || got != "nexus.events.sandbox.created."+testSandbox {
		t.Fatalf("Subject = %q, %v", got, err)
	}
	if got, _ := Subject(ReapDecided, ""); got != "nexus.events.reap.decided._" {
		t.Fatalf("no-sandbox subject = %q", got)
	}
	if _, err := Subject(SandboxCreated, "not.a.ulid"); err == nil {
		t.Fatal("accepted a sandbox token with dots")
	}
	filters := map[[2]string]string{
		{"", ""}:                      "nexus.events.*.*.*",
		{"reap", ""}:                  "nexus.events.reap.*.*",
		{"reap.decided", testSandbox}: "nexus.events.reap.decided." + testSandbox,
	}
	for in, want := range filters {
		if got, err := FilterSubject(in[0], in[1]); err != nil || got != want {
			t.Errorf("FilterSubject(%q,%q) = %q, %v; want %q", in[0], in[1], got, err, want)
		}
	}
	sets := []struct {
		types   []string
		sandbox string
		want    []string
	}{
		{nil, "", nil},
		{[]string{"", "reap"}, "", nil},
		{nil, testSandbox, []string{"nexus.events.*.*." + testSandbox}},
		{[]string{"reap.decided", "reap", "sandbox.created", "reap.applied", "sandbox.created"}, "",
			[]string{"nexus.events.reap.*.*", "nexus.events.sandbox.created.*"}},
		{[]string{"sandbox.created", "", "vmm"}, testSandbox, []string{"nexus.events.*.*." + testSandbox}},
	}
	for _, c := range sets {
		got, err := FilterSubjects(c.types, c.sandbox)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("FilterSubjects(%q, %q) = %q, %v; want %q", c.types, c.sandbox, got, err, c.want)
		}
	}
	if _, err := FilterSubjects([]string{"", "sandbox.teleported"}, ""); !errors.Is(err, ErrUnknownType) {
		t.Errorf("FilterSubjects accepted an unknown type beside all: %v", err)
	}
	for _, bad := range []string{"reaps", "reap.*", "sandbox.created.x", ">"} {
		if _, err := FilterSubject(bad, ""); !errors.Is(err, ErrUnknownType) {
			t.Errorf("FilterSubject(%q) = %v, want ErrUnknownType", bad, err)
		}
	}
}

// A volume's own events are on its own subject, which its filter matches
// and no other volume's, sandbox's or handle's does; attachments stay on
// their sandbox's subject.
func TestVolumeSubjects(t *testing.T) {
	own := []struct {
		p    Payload
		name string
		want string
	}{
		{VolumeCreatedEvent{Name: "data"}, "data", "nexus.events.volume.created.v_data"},
		{VolumeRemovedEvent{Name: "my_vol"}, "my_vol", "nexus.events.volume.removed.v_my_5Fvol"},
		{VolumeCreatedEvent{Name: "my-vol"}, "my-vol", "nexus.events.volume.created.v_my-vol"},
	}
	for _, c := range own {
		got, err := New(testID, testTime, "", c.p).Subject()
		if err != nil || got != c.want {
			t.Errorf("%s of %q: subject %q, %v; want %q", c.p.EventType(), c.name, got, err, c.want)
		}
		for _, o := range own {
			f := VolumeSubjects(o.name)
			if match := subjectMatch(f, got); match != (o.name == c.name) {
				t.Errorf("filter %s matches %s: %v", f, got, match)
			}
		}
	}
	if got, _ := New(testID, testTime, testSandbox, VolumeAttachedEvent{Name: "data"}).Subject(); got != "nexus.events.volume.attached."+testSandbox {
		t.Errorf("volume.attached subject = %q, want its sandbox's", got)
	}
	if _, err := New(testID, testTime, "", VolumeCreatedEvent{}).Subject(); err == nil {
		t.Error("a volume.created naming no volume has a subject")
	}
	// The token is injective and never a sandbox's, a handle's or NoSandbox.
	seen := map[string]string{}
	for _, name := range []string{"a", "a_", "a_5F", "a-b", "a.b", "a/b", "A", "_", "", "h_x"} {
		tok := VolumeToken(name)
		if prev, ok := seen[tok]; ok {
			t.Errorf("VolumeToken(%q) = VolumeToken(%q) = %s", name, prev, tok)
		}
		seen[tok] = name
		if _, err := ulid.ParseStrict(tok); err == nil || tok == NoSandbox || strings.HasPrefix(tok, "h_") || strings.ContainsAny(tok, ".*> ") {
			t.Errorf("VolumeToken(%q) = %q is not a volume's own token", name, tok)
		}
	}
}

// subjectMatch reports whether filter, whose '*' is one token, matches
// subject.
func subjectMatch(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	if len(f) != len(s) {
		return false
	}
	for i := range f {
		if f[i] != "*" && f[i] != s[i] {
			return false
		}
	}
	return true
}

func FuzzDecode(f *testing.F) {
	for _, p := range samples {
		data, err := Encode(New(testID, testTime, testSandbox, p))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := Decode(data)
		if err != nil {
			return
		}
		// Anything that decodes must re-encode and decode to the same event.
		again, err := Encode(e)
		if err != nil {
			t.Fatalf("decoded event does not re-encode: %v", err)
		}
		if _, err := Decode(again); err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
	})
}

// Causation was in the envelope but never set; a record that carries the
// "cause" key (written by hand or by an older build) must still decode.
func TestDecodeIgnoresLegacyCause(t *testing.T) {
	payload, err := msgpack.Marshal(SandboxRemovedEvent{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := msgpack.Marshal(&wire{Format: EnvelopeFormat, ID: testID[:], Type: string(SandboxRemoved),
		Schema: registry[SandboxRemoved].current, Sandbox: testSandbox, Time: testTime.UnixNano(), Cause: "cmd-1", Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte("cause")) {
		t.Fatal("fixture lacks the cause key")
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatalf("decode a record with cause: %v", err)
	}
	if got.ID != testID || got.Sandbox != testSandbox || got.Type != SandboxRemoved {
		t.Fatalf("decoded %+v", got)
	}
	again, err := Encode(got)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(again, []byte("cause")) {
		t.Fatal("encode wrote the cause key")
	}
}

// A payload decoded after another of its type holds only its own
// fields, and the first keeps its own: the value a decode fills is used
// again.
func TestDecodeKeepsNothingFromThePreviousPayload(t *testing.T) {
	full := SandboxCreatedEvent{Handle: "web", Image: "i", Driver: "process", Labels: Labels{"k": "v"},
		Resources: []Resource{{Kind: KindRawDisk, Path: "/d"}}, Boot: BootConfig{Cpus: 2}}
	bare := SandboxCreatedEvent{Image: "j", Driver: "process"}
	var got []Payload
	for _, p := range []Payload{full, bare, full} {
		data, err := Encode(New(testID, testTime, testSandbox, p))
		if err != nil {
			t.Fatal(err)
		}
		e, err := Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Payload)
	}
	if !reflect.DeepEqual(got, []Payload{full, bare, full}) {
		t.Fatalf("decoded in turn: %+v", got)
	}
}

// An envelope decoded after another holds only what its own record
// says: no sandbox, saga or step the record lacks, no payload of the
// record before when its own is upcast, and a malformed record is
// refused whatever came before it. The envelope a decode reads into is
// used again.
func TestDecodeKeepsNothingFromThePreviousEnvelope(t *testing.T) {
	current := New(testID, testTime, testSandbox, SandboxCreatedEvent{Handle: "web", Image: "i", Driver: "process"})
	current.Saga, current.Step = "01JDQ4Z6X1M9A3Y0C5TB2R8NKX", "boot"
	full, err := Encode(current)
	if err != nil {
		t.Fatal(err)
	}
	v1 := rawEvent(t, wire{Type: string(SandboxCreated), Schema: 1, Time: testTime.UnixNano(),
		Payload: payloadBytes(t, sandboxCreatedV1{Handle: "h", Image: "img", Driver: "process"})})
	noID := rawEvent(t, wire{ID: []byte{}, Type: string(SandboxRemoved), Schema: 1, Payload: payloadBytes(t, SandboxRemovedEvent{})})
	for range 2 {
		if _, err := Decode(full); err != nil {
			t.Fatal(err)
		}
		got, err := Decode(v1)
		if err != nil {
			t.Fatal(err)
		}
		if got.Sandbox != "" || got.Saga != "" || got.Step != "" || got.Payload.(SandboxCreatedEvent).Handle != "h" {
			t.Fatalf("decoded after a full record: %+v", got)
		}
		if _, err := Decode(full); err != nil {
			t.Fatal(err)
		}
		if e, err := Decode(noID); !errors.Is(err, ErrMalformed) {
			t.Fatalf("a record without an id, decoded after one with it: %+v, %v", e, err)
		}
	}
}

// A payload that is msgpack's nil decodes as the zero payload, as a
// payload decoded on its own (StrictUnmarshal) reads it, in either order
// of the envelope's keys; it never panics.
func TestDecodeNilPayloadIsTheZeroPayload(t *testing.T) {
	nilPayload := []byte{0xc0}
	for name, data := range map[string][]byte{
		"payload last":  rawEvent(t, wire{Type: string(SandboxStopped), Schema: 1, Time: 1, Payload: nilPayload}),
		"payload first": payloadBytes(t, map[string]any{"p": msgpack.RawMessage(nilPayload), "f": 1, "id": testID[:], "t": string(SandboxStopped), "v": 1, "ts": 1}),
	} {
		e, err := Decode(data)
		if err != nil || e.Payload != (SandboxStoppedEvent{}) {
			t.Errorf("%s: %+v, %v", name, e.Payload, err)
		}
	}
}
