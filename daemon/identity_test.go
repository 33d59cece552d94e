package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/wire"
)

// TestIdentityCarriesStatus: the first exchange on a connection (the
// root's identity) also gives the daemon's Status, the same a question of
// its own gets, so a client decides on one exchange whether the daemon
// serves it.
func TestIdentityCarriesStatus(t *testing.T) {
	d := startDaemon(t, "")
	sock := filepath.Join(d.root, wire.SocketName)
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET "+wire.PathIdentity+" HTTP/1.1\r\nHost: nexus\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var id wire.RootIdentity
	if err := json.NewDecoder(resp.Body).Decode(&id); err != nil {
		t.Fatalf("%s: %v", resp.Status, err)
	}
	if id.Status == nil {
		t.Fatalf("the identity answer carries no status: %+v", id)
	}
	c, err := control.Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*id.Status, st) || st.Build == nil {
		t.Fatalf("status with the identity %+v, asked apart %+v", *id.Status, st)
	}
}
