package lifecycle

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/layout"
)

// FuzzArgumentsThatBecomePaths: a handle, shadow name or volume name that
// create and volume accept becomes file names that stay directly inside
// their directory of the state root; nothing a user types reaches a
// parent directory, another kind's directory, or volumes/ from disks/.
func FuzzArgumentsThatBecomePaths(f *testing.F) {
	for _, s := range [][2]string{{"dev/one", "cfg"}, {"a/../b", "x"}, {"..", "y"}, {"a", "../../etc"}, {"x/./y", "v-1"}} {
		f.Add(s[0], s[1])
	}
	root := layout.Root("/state")
	const child = "01JABCDEFGHJKMNPQRSTVWXYZ0"
	f.Fuzz(func(t *testing.T, handle, name string) {
		handleOK := validHandle(handle) && !strings.Contains(handle, "..")
		if handleOK && ValidName(name) {
			for _, p := range []string{root.ShadowDisk(handle, name), root.ShadowIntent(handle), root.ForkShadowDisk(child, handle, name)} {
				if filepath.Dir(p) != root.Disks() || filepath.Clean(p) != p {
					t.Fatalf("handle %q, name %q give %q, not a file directly in disks/", handle, name, p)
				}
			}
		}
		if ValidName(name) {
			if p := root.VolumeDir(name); filepath.Dir(p) != root.Volumes() || filepath.Clean(p) != p {
				t.Fatalf("volume %q gives %q", name, p)
			}
		}
	})
}
