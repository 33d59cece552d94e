package daemon

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/control/wire"
)

// TestGateHoldsAllButTheEarlyReads: while the journal opens, the identity
// and the sandbox store's reads are answered and an append or an events
// read waits; once ready is closed, everything is.
func TestGateHoldsAllButTheEarlyReads(t *testing.T) {
	ready := make(chan struct{})
	served := make(chan string, 16)
	h := gated(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.Method + " " + r.URL.Path
	}), ready)
	do := func(method, path string) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, path, nil))
		}()
		return done
	}
	for _, p := range []string{wire.PathIdentity, wire.PathListJSON, wire.PathSandbox, wire.PathNamed} {
		<-do("GET", p)
		if got := <-served; got != "GET "+p {
			t.Fatalf("served %q, want GET %s", got, p)
		}
	}
	held := []<-chan struct{}{do("POST", wire.PathAppendStream), do("GET", wire.PathEvents), do("GET", wire.PathRev)}
	// A broken gate serves them at once; a working one never before ready.
	// The wait can only miss a broken gate on a slow machine, never fail a
	// working one.
	select {
	case got := <-served:
		t.Fatalf("%s was served before the journal opened", got)
	case <-time.After(200 * time.Millisecond):
	}
	close(ready)
	for _, done := range held {
		<-done
	}
	if len(served) != len(held) {
		t.Fatalf("%d held requests served once ready, want %d", len(served), len(held))
	}
}
