package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/guard"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/host/unixsock"
	"github.com/nexus-sandbox/nexus/node"
	"github.com/nexus-sandbox/nexus/projections"
)

// Status describes a running daemon.
type Status struct {
	Pid           int    `json:"pid"`
	Root          string `json:"root"`
	SubscriberURL string `json:"subscriber_url,omitempty"`
}

// wireRecord carries one event as its journal bytes, so the client decodes
// with the same code, and the same errors, as a local reader.
type wireRecord struct {
	Seq   uint64 `json:"seq,omitempty"`
	Data  []byte `json:"data,omitempty"`
	Error string `json:"error,omitempty"`
}

type sandboxResponse struct {
	Found   bool                `json:"found"`
	Sandbox projections.Sandbox `json:"sandbox"`
}

type appendRequest struct {
	Events [][]byte       `json:"events"`
	Expect []guard.Expect `json:"expect,omitempty"`
}

type appendResponse struct {
	Seqs       []uint64          `json:"seqs"`
	Error      string            `json:"error,omitempty"`
	Conflict   bool              `json:"conflict,omitempty"`
	Stale      *guard.StaleError `json:"stale,omitempty"`
	SagaClosed bool              `json:"saga_closed,omitempty"`
}

// Serve answers control requests for n on <root>/nexus.sock (mode 0600)
// until ctx is done. The caller owns n's journal lock, so any socket file
// already there is a dead daemon's and is replaced.
func Serve(ctx context.Context, n *node.Node) error {
	// Holding the journal lock, we know any socket file there is a dead
	// daemon's; Listen replaces it because it refuses connections.
	ln, err := unixsock.Listen(filepath.Join(n.Root(), SocketName))
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	srv := &http.Server{Handler: handler(n), BaseContext: func(net.Listener) context.Context { return ctx }}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	err = srv.Serve(ln)
	ln.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func handler(n *node.Node) http.Handler {
	mux := http.NewServeMux()
	local := Local{n}
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, Status{Pid: os.Getpid(), Root: n.Root(), SubscriberURL: n.Journal().ClientURL()})
	})
	mux.HandleFunc("POST /v1/append", func(w http.ResponseWriter, r *http.Request) {
		var req appendRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, appendResponse{Error: "bad append request: " + err.Error()})
			return
		}
		evs := make([]events.Event, 0, len(req.Events))
		for _, data := range req.Events {
			e, err := events.Decode(data)
			if err != nil {
				writeJSON(w, http.StatusBadRequest, appendResponse{Error: err.Error()})
				return
			}
			evs = append(evs, e)
		}
		seqs, err := n.AppendExpect(r.Context(), req.Expect, evs...)
		if err != nil {
			resp := appendResponse{Seqs: seqs, Error: err.Error(), Conflict: errors.Is(err, journal.ErrConflict), SagaClosed: errors.Is(err, guard.ErrSagaClosed)}
			errors.As(err, &resp.Stale)
			writeJSON(w, http.StatusConflict, resp)
			return
		}
		writeJSON(w, http.StatusOK, appendResponse{Seqs: seqs})
	})
	mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) {
		q, err := parseQuery(r)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, wireRecord{Error: err.Error()})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		flusher, _ := w.(http.Flusher)
		err = n.Events(r.Context(), q, func(rec node.Record) error {
			data, err := events.Encode(rec.Event)
			if err != nil {
				return err
			}
			if err := enc.Encode(wireRecord{Seq: rec.Seq, Data: data}); err != nil {
				return err
			}
			if q.Follow && flusher != nil {
				flusher.Flush()
			}
			return nil
		})
		if err != nil && r.Context().Err() == nil {
			enc.Encode(wireRecord{Error: err.Error()})
		}
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		list, _ := local.Sandboxes(r.Context())
		writeJSON(w, http.StatusOK, list)
	})
	mux.HandleFunc("GET /v1/sandbox", func(w http.ResponseWriter, r *http.Request) {
		sb, found, _ := local.Sandbox(r.Context(), r.URL.Query().Get("ref"))
		writeJSON(w, http.StatusOK, sandboxResponse{Found: found, Sandbox: sb})
	})
	mux.HandleFunc("GET /v1/volumes", func(w http.ResponseWriter, r *http.Request) {
		list, _ := local.Volumes(r.Context())
		writeJSON(w, http.StatusOK, list)
	})
	mux.HandleFunc("GET /v1/imagecache", func(w http.ResponseWriter, r *http.Request) {
		st, _ := local.ImageCache(r.Context())
		writeJSON(w, http.StatusOK, st)
	})
	mux.HandleFunc("GET /v1/sagas", func(w http.ResponseWriter, r *http.Request) {
		list, _ := local.OpenSagas(r.Context())
		writeJSON(w, http.StatusOK, list)
	})
	return mux
}

func parseQuery(r *http.Request) (node.Query, error) {
	v := r.URL.Query()
	q := node.Query{Sandbox: v.Get("sandbox"), Type: v.Get("type"), Follow: v.Get("follow") == "1"}
	if s := v.Get("since"); s != "" {
		since, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return q, fmt.Errorf("since %q: not a sequence number", s)
		}
		q.Since = since
	}
	return q, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
