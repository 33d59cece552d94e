package daemon

import (
	"encoding/json"
	"errors"
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
	op := newOpening()
	served := make(chan string, 16)
	h := gated(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.Method + " " + r.URL.Path
	}), op)
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
	op.opened()
	for _, done := range held {
		<-done
	}
	if len(served) != len(held) {
		t.Fatalf("%d held requests served once ready, want %d", len(served), len(held))
	}
}

// TestGateAnswersAFailedOpensError: once the journal's open fails, the
// requests the gate held and every later one, the early reads included,
// are answered with the open's error, marked as such, and none reaches
// the handler.
func TestGateAnswersAFailedOpensError(t *testing.T) {
	op := newOpening()
	h := gated(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("%s %s reached the handler after the open failed", r.Method, r.URL.Path)
	}), op)
	do := func(method, path string) <-chan *httptest.ResponseRecorder {
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
			done <- w
		}()
		return done
	}
	held := []<-chan *httptest.ResponseRecorder{do("POST", wire.PathAppendStream), do("GET", wire.PathEvents)}
	openErr := errors.New("projections: /root/projections/sagas.snap is a fifo: not a regular file")
	op.fail(openErr)
	later := []<-chan *httptest.ResponseRecorder{do("GET", wire.PathIdentity), do("GET", wire.PathSandbox), do("GET", wire.PathRev)}
	for i, done := range append(held, later...) {
		w := <-done
		var ea wire.ErrorAnswer
		if err := json.Unmarshal(w.Body.Bytes(), &ea); err != nil || ea.Error != openErr.Error() ||
			w.Code != http.StatusServiceUnavailable || w.Header().Get(wire.OpenFailedHeader) == "" {
			t.Fatalf("request %d after the open failed: %d %q %q, want 503 marked, with the open's error", i, w.Code, w.Header(), w.Body.String())
		}
	}
}
