package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"

	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// Ping asks the supervisor serving stateDir who it is and which CA it holds.
// It waits as long as ctx allows.
func Ping(ctx context.Context, stateDir string) (PingInfo, error) {
	var info PingInfo
	err := getJSON(ctx, filepath.Join(stateDir, SocketName), "/ping", &info)
	return info, err
}

func getJSON(ctx context.Context, sock, urlPath string, out any) error {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return unixsock.Dial(ctx, sock)
		},
		// One request per call; a pooled connection would outlive it.
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://supervisor"+urlPath, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("supervisor: %s %s: %w", sock, urlPath, err)
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, 64<<10)
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(body)
		return fmt.Errorf("supervisor: %s %s: %s: %s", sock, urlPath, resp.Status, msg)
	}
	if err := json.NewDecoder(body).Decode(out); err != nil {
		return fmt.Errorf("supervisor: %s %s: decode: %w", sock, urlPath, err)
	}
	return nil
}
