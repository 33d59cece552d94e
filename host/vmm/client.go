package vmm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// Client calls a VMM's REST API on its unix socket. Give every call a context
// with a deadline: a VMM that accepts but never answers is indistinguishable
// from a slow one.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the API socket at apiSocket.
func NewClient(apiSocket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return unixsock.Dial(ctx, apiSocket)
		},
		// A fresh connection per call: a pooled connection to a VMM that has
		// since died fails with EOF or ECONNRESET, which says nothing, where a
		// fresh dial says ECONNREFUSED or ENOENT, which IsDead can trust.
		DisableKeepAlives: true,
	}
	return &Client{socket: apiSocket, hc: &http.Client{Transport: tr}}
}

// APIError is a VMM's non-2xx answer.
type APIError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *APIError) Error() string {
	body := strings.Join(strings.Fields(e.Body), " ")
	if len(body) > 512 {
		body = body[:512] + "..."
	}
	return fmt.Sprintf("vmm %s %s: HTTP %d %s: %s", e.Method, e.Path, e.Status, http.StatusText(e.Status), body)
}

// IsDead reports whether err shows that nothing serves the API socket: the
// dial was refused (a socket file with no listener, as a killed VMM leaves) or
// found no socket file. Any other failure, a timeout above all, is
// ambiguous: the VMM may be alive and busy.
func IsDead(err error) bool {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		return false
	}
	return errors.Is(op.Err, syscall.ECONNREFUSED) || errors.Is(op.Err, syscall.ENOENT)
}

// Ping returns the VMM's version string.
func (c *Client) Ping(ctx context.Context) (string, error) {
	var r PingResponse
	if err := c.do(ctx, http.MethodGet, OpPing, nil, &r); err != nil {
		return "", err
	}
	return r.Version, nil
}

// Create defines the VM without booting it.
func (c *Client) Create(ctx context.Context, cfg Config) error {
	return c.do(ctx, http.MethodPut, OpCreate, cfg, nil)
}

func (c *Client) Boot(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, OpBoot, nil, nil)
}

// Shutdown stops the VM; the VMM process keeps running.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, OpShutdown, nil, nil)
}

// Delete forgets the VM, shutting it down first if it runs.
func (c *Client) Delete(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, OpDelete, nil, nil)
}

func (c *Client) Info(ctx context.Context) (Info, error) {
	var info Info
	err := c.do(ctx, http.MethodGet, OpInfo, nil, &info)
	return info, err
}

func (c *Client) Pause(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, OpPause, nil, nil)
}

func (c *Client) Resume(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, OpResume, nil, nil)
}

// Snapshot writes a paused VM's snapshot into dir. As with CH, the VM must
// be paused first.
func (c *Client) Snapshot(ctx context.Context, dir string) error {
	u, err := fileURL(dir)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, OpSnapshot, SnapshotRequest{DestinationURL: u}, nil)
}

// Restore recreates a VM from dir's snapshot in a VMM that has none; it comes
// back Paused, and Resume runs it.
func (c *Client) Restore(ctx context.Context, dir string) error {
	u, err := fileURL(dir)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, OpRestore, RestoreRequest{SourceURL: u}, nil)
}

// ShutdownVMM makes the VMM process exit.
func (c *Client) ShutdownVMM(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, OpShutdownVMM, nil, nil)
}

// fileURL makes dir absolute because the VMM resolves it against its own
// working directory, not ours. CH takes the rest of the URL verbatim, without
// percent-decoding, so neither do we encode.
func fileURL(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return "file://" + abs, nil
}

// do makes the call op (OpPing, ...) of CH's API.
func (c *Client) do(ctx context.Context, method, op string, in, out any) error {
	path := APIRoot + op
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("vmm %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(data)
	}
	// The host part is ignored by the unix dialer; CH's docs use localhost.
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, body)
	if err != nil {
		return fmt.Errorf("vmm %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("vmm %s %s on %s: %w", method, path, c.socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("vmm %s %s: reading answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return &APIError{Method: method, Path: path, Status: resp.StatusCode, Body: string(data)}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("vmm %s %s: decoding answer: %w", method, path, err)
		}
	}
	return nil
}
