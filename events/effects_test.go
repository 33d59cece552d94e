package events

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

// TestEffectsOfEveryType states, for every event type, which payload field
// it claims and which it releases. A new type fails it until it has a row,
// and so does a Resource field that is neither claimed nor released: a
// payload naming a resource must say what it does to the resource's owner.
func TestEffectsOfEveryType(t *testing.T) {
	type effect struct{ claims, releases string } // payload field names, "" for none
	want := map[Type]effect{
		SandboxCreated:  {claims: "Resources"},
		SandboxForked:   {claims: "Resources"},
		SandboxRestored: {claims: "Resources"},
		SandboxStarted:  {claims: "Sockets"},
		SandboxReady:    {},
		SandboxNotReady: {},
		SandboxStopped:  {},
		SandboxFailed:   {},
		// sandbox.removed releases what its sandbox owns, which it does
		// not list (see Effects).
		SandboxRemoved: {},

		DiskMaterialised: {claims: "Resource"},
		IntentWritten:    {claims: "Resource"},
		IntentRetired:    {releases: "Resource"},

		SupervisorStarted: {claims: "StateDir"},
		SupervisorStopped: {},
		SupervisorExited:  {},
		VMMExited:         {},
		SnapshotTaken:     {claims: "Dir"},

		VolumeCreated:  {},
		VolumeAttached: {},
		VolumeDetached: {},
		VolumeRemoved:  {},

		FlushPending:      {},
		FlushAcknowledged: {},
		FlushRestored:     {},
		OverlayRecovered:  {},
		WarningRaised:     {},

		ResourceCreated:   {claims: "Resource"},
		ReapDecided:       {},
		ReapApplied:       {},
		ResourceReclaimed: {releases: "Resource"},

		RunSwept: {},
		RunKept:  {},

		ImageCachePrepared: {},
		ImageCacheUsed:     {},
		ImageCachePruned:   {},
		HandleClaimed:      {},
		SandboxRenamed:     {},

		MirrorCreated:        {},
		MirrorRecreated:      {},
		MirrorLinked:         {},
		MirrorUnlinked:       {},
		MirrorSettingsDiffer: {},
		MirrorRefused:        {},
		JournalDigest:        {},

		SagaStarted:     {},
		SagaFinished:    {},
		SagaCompensated: {},
	}
	resource, resources := reflect.TypeOf(Resource{}), reflect.TypeOf([]Resource{})
	for _, typ := range Types() {
		w, ok := want[typ]
		if !ok {
			t.Errorf("%s has no row: say which resources it claims and releases", typ)
			continue
		}
		// Every Resource field holds resources named after it, so what
		// Effects returns says which field it read.
		v := reflect.New(registry[typ].zero).Elem()
		for i := range v.NumField() {
			name := v.Type().Field(i).Name
			switch f := v.Field(i); f.Type() {
			case resource:
				f.Set(reflect.ValueOf(Resource{Kind: KindRecord, Path: name}))
			case resources:
				f.Set(reflect.ValueOf([]Resource{{Kind: KindRecord, Path: name + "/0"}, {Kind: KindRecord, Path: name + "/1"}}))
			default:
				continue
			}
			if name != w.claims && name != w.releases {
				t.Errorf("%s.%s is a resource %s neither claims nor releases", typ, name, typ)
			}
		}
		field := func(name string) []Resource {
			if name == "" {
				return nil
			}
			switch f := v.FieldByName(name).Interface().(type) {
			case Resource:
				return []Resource{f}
			case []Resource:
				return f
			}
			t.Fatalf("%s has no resource field %s", typ, name)
			return nil
		}
		claimed, released := Effects(New(ulid.Make(), time.Now(), "", v.Interface().(Payload)))
		if !slices.Equal(claimed, field(w.claims)) {
			t.Errorf("%s claims %v, want %v", typ, claimed, field(w.claims))
		}
		if !slices.Equal(released, field(w.releases)) {
			t.Errorf("%s releases %v, want %v", typ, released, field(w.releases))
		}
	}
}
