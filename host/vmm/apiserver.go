package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	stdlog "log"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// The HTTP-over-unix-socket scaffolding of a VMM that serves Cloud
// Hypervisor's REST subset: the process driver's (host/vmm/standin) and
// the qemu driver's (host/qemu). What a call does is each VMM's own; how
// calls are routed, refused, answered and stopped is CH's, and so shared.

// APIRoot is the path every call of CH's API is below.
const APIRoot = "/api/v1/"

// VMM is what a VMM does for each call of the API: a value to answer as
// JSON, nil for 204 No Content, or an error (its HTTPStatus, else 500).
type VMM interface {
	Ping(*http.Request) (any, error)
	ShutdownVMM(*http.Request) (any, error)
	Create(*http.Request) (any, error)
	Boot(*http.Request) (any, error)
	Shutdown(*http.Request) (any, error)
	Delete(*http.Request) (any, error)
	Info(*http.Request) (any, error)
	Pause(*http.Request) (any, error)
	Resume(*http.Request) (any, error)
	Snapshot(*http.Request) (any, error)
	Restore(*http.Request) (any, error)
}

// route is one call of the API: the method CH's router wants, and the
// VMM's method that does it.
type route struct {
	method string
	fn     func(VMM, *http.Request) (any, error)
}

// routes are the calls of CH's API nexus uses, by operation (the path
// below APIRoot).
var routes = map[string]route{
	OpPing:        {http.MethodGet, VMM.Ping},
	OpShutdownVMM: {http.MethodPut, VMM.ShutdownVMM},
	OpCreate:      {http.MethodPut, VMM.Create},
	OpBoot:        {http.MethodPut, VMM.Boot},
	OpShutdown:    {http.MethodPut, VMM.Shutdown},
	OpDelete:      {http.MethodPut, VMM.Delete},
	OpInfo:        {http.MethodGet, VMM.Info},
	OpPause:       {http.MethodPut, VMM.Pause},
	OpResume:      {http.MethodPut, VMM.Resume},
	OpSnapshot:    {http.MethodPut, VMM.Snapshot},
	OpRestore:     {http.MethodPut, VMM.Restore},
}

// Calls answers the API's calls, each run on VMM under Lock, which also
// serialises the VMM's teardown, so every call sees the previous one's
// files and sockets complete.
type Calls struct {
	VMM  VMM
	Lock sync.Locker
	// Stopping, read under Lock, says the VMM is tearing down: calls then
	// get 503.
	Stopping func() bool
	Logf     func(format string, args ...any)
	// Stop runs once vmm.shutdown has been answered, as CH answers it
	// before it exits (APIServer's Shutdown lets the reply finish).
	Stop func()
}

func (c Calls) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op, under := strings.CutPrefix(r.URL.Path, APIRoot)
	rt, ok := routes[op]
	if !ok || !under {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	// CH's router answers a known path with the wrong method 400, not 405.
	if r.Method != rt.method {
		http.Error(w, fmt.Sprintf("%s wants %s", r.URL.Path, rt.method), http.StatusBadRequest)
		return
	}
	c.Lock.Lock()
	var out any
	var err error
	if c.Stopping() {
		err = stoppingError{}
	} else {
		out, err = rt.fn(c.VMM, r)
	}
	c.Lock.Unlock()
	if err != nil {
		status := http.StatusInternalServerError
		var st interface{ HTTPStatus() int }
		if errors.As(err, &st) {
			status = st.HTTPStatus()
		}
		c.Logf("%s: %d: %v", op, status, err)
		http.Error(w, err.Error(), status)
		return
	}
	if r.Method != http.MethodGet {
		c.Logf("%s: ok", op)
	}
	if out == nil {
		w.WriteHeader(http.StatusNoContent)
	} else {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	}
	if op == OpShutdownVMM {
		c.Stop()
	}
}

type stoppingError struct{}

func (stoppingError) Error() string   { return "VMM is shutting down" }
func (stoppingError) HTTPStatus() int { return http.StatusServiceUnavailable }

// APIServer serves Handler on a unix socket (unixsock: 0600 from the
// first moment, a live listener refused).
type APIServer struct {
	Socket  string
	Handler http.Handler
	// Name is what the VMM answers to vmm.ping, for its log.
	Name     string
	Logf     func(format string, args ...any)
	ErrorLog *stdlog.Logger
	// Stop is closed when the VMM is to end of its own accord
	// (vmm.shutdown, or its guest ending).
	Stop <-chan struct{}
	// Ready, if set, is called once the socket accepts connections.
	Ready func()
	// Teardown makes the VMM refuse further calls and releases its VM,
	// before the socket stops answering, so a refused API socket never
	// coexists with a VM still held.
	Teardown func()
}

// Serve answers until ctx is done, Stop is closed or serving fails; then
// it tears down, lets the answers in flight finish (up to 5 s) and removes
// the socket. It returns nil unless serving failed.
func (a APIServer) Serve(ctx context.Context) error {
	l, err := unixsock.Listen(a.Socket)
	if err != nil {
		return fmt.Errorf("API socket: %w", err)
	}
	hs := &http.Server{Handler: a.Handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: a.ErrorLog}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	a.Logf("serving %s on %s (pid %d)", a.Name, a.Socket, os.Getpid())
	if a.Ready != nil {
		a.Ready()
	}
	var serveErr error
	served := false
	select {
	case <-ctx.Done():
		a.Logf("context done: %v", context.Cause(ctx))
	case <-a.Stop:
	case serveErr = <-errc:
		served = true
	}
	a.Teardown()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	if !served {
		serveErr = <-errc
	}
	l.Close() // Shutdown closed it already; this is the no-op twin for the error path
	a.Logf("stopped")
	if errors.Is(serveErr, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving API: %w", serveErr)
}
