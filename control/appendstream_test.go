package control_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// A client of the HTTP append (an older nexus) is refused with a reason it
// prints, in the JSON answer it decodes, and nothing is appended.
func TestAppendOverHTTPIsRefusedWithAReason(t *testing.T) {
	d := startDaemon(t, "")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return unixsock.Dial(ctx, filepath.Join(d.root, control.SocketName))
	}}}
	// The body an older client sent: the event's journal bytes, base64 in JSON.
	body := []byte(`{"events":["gqF0"]}`)
	resp, err := hc.Post("http://nexus/v1/append", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Seqs  []uint64 `json:"seqs"`
		Error string   `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("the refusal is not the JSON an older client decodes: %v", err)
	}
	if resp.StatusCode != http.StatusUpgradeRequired || !strings.Contains(out.Error, "older nexus") || len(out.Seqs) != 0 {
		t.Fatalf("HTTP append answered %s %+v; want 426 naming the older nexus", resp.Status, out)
	}
	if recs := allEvents(t, connect(t, d.root)); len(recs) != 0 {
		t.Fatalf("a refused HTTP append stored %d events", len(recs))
	}
}

// A daemon without the append stream (an older nexus) is named as such,
// and an upgrade to another stream version is refused, not misread.
func TestAppendStreamVersionMismatch(t *testing.T) {
	sock := filepath.Join(t.TempDir(), control.SocketName)
	ln, err := unixsock.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	old := &http.Server{Handler: http.NewServeMux()} // answers 404 to everything
	go old.Serve(ln)
	t.Cleanup(func() { old.Close() })
	c := control.NewClient(sock)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.Append(ctx, volumeEvent(1))
	if err == nil || !strings.Contains(err.Error(), "older nexus") {
		t.Fatalf("append to a daemon without the stream: %v; want it named an older nexus", err)
	}

	d := startDaemon(t, "")
	conn, err := unixsock.Dial(ctx, filepath.Join(d.root, control.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /v1/append-stream HTTP/1.1\r\nHost: nexus\r\nConnection: Upgrade\r\nUpgrade: nexus-append/9\r\nContent-Length: 0\r\n\r\n")
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	reply, _ := io.ReadAll(io.LimitReader(conn, 512))
	if !strings.HasPrefix(string(reply), "HTTP/1.1 426") || !strings.Contains(string(reply), "nexus-append/1") {
		t.Fatalf("upgrade to another stream version answered %q; want 426 naming the version spoken", reply)
	}
}
