package lifecycle

import (
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/driver"
)

func TestNewRefusesBadSettings(t *testing.T) {
	good := Manager{Root: "/r", B: &memJournal{}, Driver: driver.Driver{Name: driver.Process}}
	if _, err := New(good); err != nil {
		t.Fatalf("New(good) = %v", err)
	}
	for name, c := range map[string]struct {
		edit func(*Manager)
		want string
	}{
		"no root":         {func(m *Manager) { m.Root = "" }, "no state root"},
		"no backend":      {func(m *Manager) { m.B = nil }, "no backend"},
		"unknown driver":  {func(m *Manager) { m.Driver.Name = "firecracker" }, `unknown driver "firecracker"`},
		"tiny overlay":    {func(m *Manager) { m.OverlayMiB = 8 }, "overlay size 8 MiB"},
		"huge overlay":    {func(m *Manager) { m.OverlayMiB = MaxOverlayMiB + 1 }, "want 16 to"},
		"ratio above one": {func(m *Manager) { m.WarnFillRatio = 1.5 }, "warn fill ratio 1.5"},
		"negative ratio":  {func(m *Manager) { m.WarnFillRatio = -0.1 }, "warn fill ratio -0.1"},
		"negative start":  {func(m *Manager) { m.StartTimeout = -time.Second }, "negative start timeout"},
		"negative flush":  {func(m *Manager) { m.FlushDeadline = -time.Second }, "negative flush deadline"},
	} {
		m := good
		c.edit(&m)
		if _, err := New(m); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error containing %q", name, err, c.want)
		}
	}
}
