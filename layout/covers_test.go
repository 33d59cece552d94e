package layout

import (
	"path/filepath"
	"strings"
	"testing"
)

const sb = "01JABCDEFGHJKMNPQRSTVWXYZ0"

func TestCoveredBy(t *testing.T) {
	other := "01JABCDEFGHJKMNPQRSTVWXYZ1"
	for rel, want := range map[string]bool{
		"disks/" + sb + ".raw":                            true,
		"disks/" + sb + "-workspace.ext4":                 true,
		"disks/" + sb + "-dev_one.shadow.cfg.ext4":        true,
		"disks/dev_one.shadow.cfg.ext4":                   true, // handle dev/one
		"supervisors/" + sb:                               true,
		"sandboxes/" + sb:                                 true,
		"snapshots/" + sb:                                 true,
		"builder-supervisors/" + sb:                       true,
		"disks/" + other + ".raw":                         false, // another sandbox's disk
		"disks/" + other + "-dev_one.shadow.cfg.ext4":     false, // another child's copy
		"disks/old.shadow.ext4":                           false, // legacy: no handle
		"builder-supervisors/" + other:                    false,
		"disks/someone.shadow.cfg.ext4":                   false, // another handle's shadow
		"volumes/data":                                    false, // user-owned
		"volumes/data/disk.ext4":                          false,
		"caches/buildkit.ext4":                            false,
		"journal":                                         false,
		"disks/" + sb + ".create-intent.json":             false, // intents are retired, not covered
		"disks/../volumes/data":                           false,
		"/etc/passwd":                                     false,
		"supervisors/" + sb + "/../../volumes":            false,
		"disks/" + sb + "-x.shadow..ext4":                 false,
		"snapshots/" + sb + "/01JABCDEFGHJKMNPQRSTVWXYZ2": false, // the snapshots dir is covered whole, not its entries
	} {
		if got := CoveredBy(rel, sb, "dev/one"); got != want {
			t.Errorf("CoveredBy(%q) = %v, want %v", rel, got, want)
		}
	}
	for _, rel := range []string{"disks/dev_one.shadow.cfg.ext4", "disks/old.shadow.ext4", "disks/x y.shadow.cfg.ext4"} {
		if CoveredBy(rel, sb, "") {
			t.Errorf("%s covered by an intent without a handle", rel)
		}
	}
}

// FuzzCoveredBy: whatever an intent file says, a covered path stays inside
// the sandbox's own directories below the root, and is never a volume, the
// journal or the builder cache.
func FuzzCoveredBy(f *testing.F) {
	for _, seed := range []string{"disks/" + sb + ".raw", "volumes/x", "disks/h.shadow.n.ext4", "../x", "disks/" + sb + "-../../v.shadow.n.ext4"} {
		f.Add(seed, "h")
	}
	f.Fuzz(func(t *testing.T, rel, handle string) {
		if !CoveredBy(rel, sb, handle) {
			return
		}
		root := Root("/state")
		abs := root.Abs(rel)
		back, err := filepath.Rel("/state", abs)
		if err != nil || strings.HasPrefix(back, "..") || back != rel {
			t.Fatalf("%q escapes the root (%q)", rel, back)
		}
		top := strings.SplitN(rel, "/", 2)[0]
		switch top {
		case "disks", "supervisors", "sandboxes", "snapshots", "builder-supervisors":
		default:
			t.Fatalf("%q is under %s/", rel, top)
		}
		if strings.Count(rel, "/") != 1 {
			t.Fatalf("%q is not a direct entry of %s/", rel, top)
		}
		if top != "disks" && !strings.HasSuffix(rel, "/"+sb) {
			t.Fatalf("%q is not this sandbox's directory", rel)
		}
	})
}
