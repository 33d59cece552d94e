package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/internal/jstest"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// The aggregate's de-duplication window keeps a record a source delivers
// again out of it: JetStream sources at least once, and a sourced record
// keeps its journal event's ID. Here a second source of one mirror, under
// a narrower filter, delivers each of its records again.
func TestAggregateStoresASourcedRecordOnce(t *testing.T) {
	js := jstest.Connect(t, jstest.Start(t, server.Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	defer cancel()
	mirror := MirrorStream("host-b")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: mirror, Subjects: []string{"host-b.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, "host-b.nexus.events.sandbox.created.x", []byte("b"), jetstream.WithMsgID(fmt.Sprintf("event-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	agg, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: AggregateStream, Duplicates: aggregateDuplicates,
		Sources: []*jetstream.StreamSource{{Name: mirror}}})
	if err != nil {
		t.Fatal(err)
	}
	jstest.WaitMsgs(t, ctx, agg, 3)
	cfg := agg.CachedInfo().Config
	cfg.Sources = append(cfg.Sources, &jetstream.StreamSource{Name: mirror, FilterSubject: "host-b.nexus.>"})
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// The second source has delivered all it had once the mirror's next
	// record arrives through both sources: 3 + 1 stored, not 3 + 3 + 2.
	if _, err := js.Publish(ctx, "host-b.nexus.events.sandbox.created.x", []byte("b"), jetstream.WithMsgID("event-3")); err != nil {
		t.Fatal(err)
	}
	jstest.WaitMsgs(t, ctx, agg, 4)
	for deadline := time.Now().Add(testutil.Scale(2 * time.Second)); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if info, err := agg.Info(ctx); err != nil || info.State.Msgs != 4 {
			t.Fatalf("the aggregate holds %+v (%v): a record stored again", info.State, err)
		}
	}
}
