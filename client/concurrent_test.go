package client_test

import (
	"context"
	"sync"
	"testing"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// TestCreateFromTwoGoroutines: one client, two goroutines creating at once
// on a root where nobody started a daemon; every create succeeds and Close
// removes them all.
func TestCreateFromTwoGoroutines(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	c := processClient(t, root)
	img := image(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	ids := make(chan string, 6)
	for range 2 {
		wg.Go(func() {
			for range 3 {
				sb, err := c.Create(ctx, client.CreateSpec{Image: img})
				errs <- err
				ids <- sb.ID
			}
		})
	}
	wg.Wait()
	close(errs)
	close(ids)
	for err := range errs {
		if err != nil {
			t.Fatalf("create: %v", err)
		}
	}
	live := liveIDs(t, root)
	for id := range ids {
		if !live[id] {
			t.Fatalf("created %s is not listed", id)
		}
	}
	if len(live) != 6 {
		t.Fatalf("%d sandboxes live, want 6", len(live))
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(liveIDs(t, root)); n != 0 {
		t.Fatalf("%d sandboxes left after Close", n)
	}
}
