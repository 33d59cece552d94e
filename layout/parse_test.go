package layout

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
)

// built is every name the builders make for sandbox id (handle h, shadow
// name s, client run run), with what it must parse back to.
func built(r Root, id, h, s, run string) []struct {
	path string
	want Name
} {
	safe := SafeHandle(h)
	return []struct {
		path string
		want Name
	}{
		{r.RawDisk(id), Name{Kind: events.KindRawDisk, ID: id}},
		{r.WorkspaceDisk(id), Name{Kind: events.KindWorkspaceDisk, ID: id}},
		{r.CreateIntent(id), Name{Kind: events.KindCreateIntent, ID: id}},
		{r.OverlayStaging(id), Name{Kind: events.KindOverlayStaging, ID: id}},
		{r.ShadowDisk(h, s), Name{Kind: events.KindShadowDisk, Handle: safe, Shadow: s}},
		{r.ShadowIntent(h), Name{Kind: events.KindShadowIntent, Handle: safe}},
		{r.ForkShadowDisk(id, h, s), Name{Kind: events.KindShadowDisk, ID: id, Parent: safe, Shadow: s}},
		{r.APISocket(id), Name{Kind: events.KindAPISocket, ID: id}},
		{r.APISocketLock(id), Name{Kind: events.KindAPISocketLock, ID: id}},
		{r.VsockSocket(id), Name{Kind: events.KindVsockSocket, ID: id}},
		{r.IIDSocket(id), Name{Kind: events.KindIIDSocket, ID: id}},
		{r.SupervisorDir(id), Name{Kind: events.KindSupervisorState, ID: id}},
		{r.BuilderDir(id), Name{Kind: events.KindBuilderSupervisor, ID: id}},
		{r.SnapshotsOf(id), Name{Kind: events.KindSnapshot, ID: id}},
		{filepath.Dir(r.Record(id)), Name{Kind: events.KindRecord, ID: id}},
		{r.VMMLog(id), Name{Kind: events.KindLog, ID: id}},
		{r.SupervisorLog(id), Name{Kind: events.KindLog, ID: id}},
		{r.ConsoleLog(id), Name{Kind: events.KindLog, ID: id}},
		{r.ConsoleIndex(id), Name{Kind: events.KindLog, ID: id}},
		{r.WatchdogLog(run), Name{Kind: events.KindWatchdogLog, Run: run}},
	}
}

// TestParseReadsBackEveryBuiltName: every name a builder makes for a
// sandbox parses back to the kind, ID, handle and shadow name it was made
// from, and so does the staged name an intent is published from.
func TestParseReadsBackEveryBuiltName(t *testing.T) {
	r := Root("/state")
	for _, h := range []string{"dev/one", "a_b", "x.shadow.y", "web"} {
		for _, tc := range built(r, sb, h, "cfg", "run-1") {
			rel := r.Rel(tc.path)
			if got, ok := Parse(rel); !ok || got != tc.want {
				t.Errorf("Parse(%q) = %+v, %v; want %+v", rel, got, ok, tc.want)
			}
			if tc.want.Kind == events.KindCreateIntent || tc.want.Kind == events.KindShadowIntent {
				staged := filepath.Join(filepath.Dir(rel), "."+filepath.Base(rel)+stageInfix+"123")
				want := tc.want
				want.Staged = true
				if got, ok := Parse(staged); !ok || got != want {
					t.Errorf("Parse(%q) = %+v, %v; want %+v", staged, got, ok, want)
				}
			}
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for rel, want := range map[string]Name{
		"disks/x.raw":                          {Kind: events.KindRawDisk, Unparsed: true},
		"disks/old.shadow.ext4":                {Kind: events.KindShadowDisk, Legacy: true},
		"disks/a b.shadow.cfg.ext4":            {Kind: events.KindShadowDisk, Unparsed: true},   // no handle maps to it
		"disks/" + sb + "-a%b.shadow.cfg.ext4": {Kind: events.KindShadowDisk, Unparsed: true},   // nor to the parent's part
		"disks/web.shadow..ext4":               {Kind: events.KindShadowDisk, Unparsed: true},   // no shadow name
		"disks/web.shadow.a.b.ext4":            {Kind: events.KindShadowDisk, Unparsed: true},   // a shadow name holds no '.'
		"disks/a b.shadow-intent.json":         {Kind: events.KindShadowIntent, Unparsed: true}, // no handle maps to it
		"disks/.shadow-intent.json":            {Kind: events.KindRawDisk, Unparsed: true},      // no handle at all
		"disks/.x.create-intent.json.stage-1":  {Kind: events.KindRawDisk, Unparsed: true},      // staged, but no ULID
		"run/sb-x.sock":                        {Kind: events.KindAPISocket, Unparsed: true},
		"run/" + sb + ".sock":                  {Kind: events.KindAPISocket, Unparsed: true},
		"logs/x.vmm.log":                       {Kind: events.KindLog, Unparsed: true},
		"logs/run-a b.watchdog.log":            {Kind: events.KindWatchdogLog, Run: "a b", Unparsed: true},
		"supervisors/x":                        {Kind: events.KindSupervisorState, Unparsed: true},
		"snapshots/" + strings.ToLower(sb):     {Kind: events.KindSnapshot, Unparsed: true},
		"sandboxes/" + sb + "x":                {Kind: events.KindRecord, Unparsed: true},
		"builder-supervisors/" + sb[:25]:       {Kind: events.KindBuilderSupervisor, Unparsed: true},
	} {
		if got, ok := Parse(rel); !ok || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", rel, got, ok, want)
		}
	}
	for _, rel := range []string{"", "disks", "disks/", "/state/disks/" + sb + ".raw", "disks/../disks/" + sb + ".raw",
		"volumes/data", "images/x", "journal", "caches/x", "snapshots/" + sb + "/" + sb, "./disks/x"} {
		if got, ok := Parse(rel); ok {
			t.Errorf("Parse(%q) = %+v, want not a name of the state root", rel, got)
		}
	}
	if n := ParseEntry("logs", sb+".vmm.log", true); !n.Unparsed {
		t.Errorf("a directory named like a log parsed as %+v", n)
	}
}

// rebuilt is the path the builders make for n in dir, or the paths for a
// kind several builders share.
func rebuilt(r Root, dir string, n Name) []string {
	handle := func(safe string) string { h, _ := HandleOf(safe); return h }
	switch n.Kind {
	case events.KindRawDisk:
		return []string{r.RawDisk(n.ID)}
	case events.KindWorkspaceDisk:
		return []string{r.WorkspaceDisk(n.ID)}
	case events.KindCreateIntent:
		return []string{r.CreateIntent(n.ID)}
	case events.KindOverlayStaging:
		return []string{r.OverlayStaging(n.ID)}
	case events.KindShadowIntent:
		return []string{r.ShadowIntent(handle(n.Handle))}
	case events.KindShadowDisk:
		if n.ID != "" {
			return []string{r.ForkShadowDisk(n.ID, handle(n.Parent), n.Shadow)}
		}
		return []string{r.ShadowDisk(handle(n.Handle), n.Shadow)}
	case events.KindAPISocket:
		return []string{r.APISocket(n.ID)}
	case events.KindAPISocketLock:
		return []string{r.APISocketLock(n.ID)}
	case events.KindVsockSocket:
		return []string{r.VsockSocket(n.ID)}
	case events.KindIIDSocket:
		return []string{r.IIDSocket(n.ID)}
	case events.KindSupervisorState:
		return []string{r.SupervisorDir(n.ID)}
	case events.KindBuilderSupervisor:
		return []string{r.BuilderDir(n.ID)}
	case events.KindSnapshot:
		return []string{r.SnapshotsOf(n.ID)}
	case events.KindRecord:
		return []string{filepath.Dir(r.Record(n.ID))}
	case events.KindLog:
		return []string{r.VMMLog(n.ID), r.SupervisorLog(n.ID), r.ConsoleLog(n.ID), r.ConsoleIndex(n.ID)}
	case events.KindWatchdogLog:
		return []string{r.WatchdogLog(n.Run)}
	}
	return nil
}

// FuzzParse: a name parses to one meaning, and building that meaning gives
// the name back (the grammar is the builders' inverse, so two builders
// never share a name and a parsed name is the one that was built); a
// staged intent's final name is built instead.
func FuzzParse(f *testing.F) {
	r := Root("/state")
	for _, h := range []string{"dev/one", "a_b", "x.shadow.y"} {
		for _, tc := range built(r, sb, h, "cfg", "r1") {
			f.Add(filepath.Base(filepath.Dir(tc.path)), filepath.Base(tc.path))
		}
	}
	f.Add("disks", ".dev_one.shadow-intent.json.stage-9")
	f.Add("disks", sb+"-"+sb+"-x.shadow.y.ext4")
	f.Fuzz(func(t *testing.T, dir, name string) {
		if !isDir(dir) || name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			return
		}
		n := ParseEntry(dir, name, false)
		if intent := n.Kind == events.KindCreateIntent || n.Kind == events.KindShadowIntent; intent && dir == "disks" && !MayBeIntent(name) {
			t.Fatalf("disks/%s parses as an intent (%+v) that MayBeIntent passes over", name, n)
		}
		if n.Unparsed || n.Legacy {
			return
		}
		if n.Kind == "" {
			t.Fatalf("%s/%s parsed without a kind: %+v", dir, name, n)
		}
		want := filepath.Join(string(r), dir, name)
		if n.Staged {
			final, _ := stagedName(name)
			want = filepath.Join(string(r), dir, final)
		}
		paths := rebuilt(r, dir, n)
		for _, p := range paths {
			if p == want {
				return
			}
		}
		t.Fatalf("%s/%s parsed as %+v, which builds %q", dir, name, n, paths)
	})
}

// FuzzBuiltNamesParseBack: whatever handle and shadow name lifecycle
// accepts, every name built from them parses back to them, so the reaper
// correlates a shadow disk with the right handle and a fork copy with its
// child; "a/b" and "a_b" never meet.
func FuzzBuiltNamesParseBack(f *testing.F) {
	for _, h := range []string{"a/b", "a_b", "dev/one", "x.shadow.y", "a_/b", "a/_b", "team_web"} {
		f.Add(h, "cfg")
	}
	r := Root("/r")
	f.Fuzz(func(t *testing.T, handle, name string) {
		if !isHandleChars(handle) || strings.Contains(handle, "..") || !validShadowName(name) || strings.ContainsAny(name, "/\x00") {
			t.Skip()
		}
		if _, _, ok := ForkPrefixed(handle); ok {
			t.Skip() // lifecycle refuses such a handle: it names fork copies
		}
		for _, tc := range built(r, sb, handle, name, "r1") {
			if got, ok := Parse(r.Rel(tc.path)); !ok || got != tc.want {
				t.Fatalf("%s parsed back as %+v, %v; want %+v", tc.path, got, ok, tc.want)
			}
		}
	})
}

const (
	idA = "01HZZZZZZZZZZZZZZZZZZZZZZA"
	idC = "01HZZZZZZZZZZZZZZZZZZZZZZC"
)

// The daemon's log lives in logs/ but is nobody's resource; a client run's
// watchdog log is its run's (KindWatchdogLog).
func TestNotResource(t *testing.T) {
	for _, c := range []struct {
		dir, name string
		want      bool
	}{
		{"logs", "daemon.log", true},
		{"logs", "run-" + idA + ".watchdog.log", false},
		{"logs", idA + ".vmm.log", false},
		{"disks", "daemon.log", false},
	} {
		if got := NotResource(c.dir, c.name); got != c.want {
			t.Errorf("NotResource(%q, %q) = %v", c.dir, c.name, got)
		}
	}
}

// TestParseEntryNames: the names of each directory, as a scan sees them.
func TestParseEntryNames(t *testing.T) {
	cases := []struct {
		dir, name string
		kind      events.ResourceKind
		id, h     string
		legacy    bool
		unparsed  bool
	}{
		{"disks", idA + ".raw", events.KindRawDisk, idA, "", false, false},
		{"disks", idA + "-workspace.ext4", events.KindWorkspaceDisk, idA, "", false, false},
		{"disks", idA + ".overlay-staging.ext4", events.KindOverlayStaging, idA, "", false, false},
		{"disks", idA + ".create-intent.json", events.KindCreateIntent, idA, "", false, false},
		{"disks", "." + idA + ".create-intent.json.stage-123", events.KindCreateIntent, idA, "", false, false},
		{"disks", "team_web.shadow-intent.json", events.KindShadowIntent, "", "team_web", false, false},
		{"disks", "team+web.shadow.cfg.ext4", events.KindShadowDisk, "", "team+web", false, false},
		{"disks", "a.shadow.b.shadow.cfg.ext4", events.KindShadowDisk, "", "a.shadow.b", false, false},
		{"disks", "bad%5F.shadow.cfg.ext4", events.KindShadowDisk, "", "", false, true},
		{"disks", "bad%5F.shadow-intent.json", events.KindShadowIntent, "", "", false, true},
		{"disks", "team_web.shadow.cfg.ext4", events.KindShadowDisk, "", "team_web", false, false},
		{"disks", idC + "-team_web.shadow.cfg.ext4", events.KindShadowDisk, idC, "", false, false}, // the child's, not the handle's
		{"disks", "old.shadow.ext4", events.KindShadowDisk, "", "", true, false},
		{"disks", "notes.txt", events.KindRawDisk, "", "", false, true},
		{"disks", strings.ToLower(idA) + ".raw", events.KindRawDisk, "", "", false, true},
		{"run", "sb-" + idA + ".sock", events.KindAPISocket, idA, "", false, false},
		{"run", "sb-" + idA + ".sock.lock", events.KindAPISocketLock, idA, "", false, false},
		{"run", "sb-" + idA + ".vsock", events.KindVsockSocket, idA, "", false, false},
		{"run", "sb-" + idA + ".iid", events.KindIIDSocket, idA, "", false, false},
		{"run", "other.sock", events.KindAPISocket, "", "", false, true},
		{"supervisors", idA, events.KindSupervisorState, idA, "", false, false},
		{"builder-supervisors", idA, events.KindBuilderSupervisor, idA, "", false, false},
		{"snapshots", idA, events.KindSnapshot, idA, "", false, false},
		{"sandboxes", idA, events.KindRecord, idA, "", false, false},
		{"logs", idA + ".vmm.log", events.KindLog, idA, "", false, false},
		{"logs", idA + ".supervisor.log", events.KindLog, idA, "", false, false},
		{"logs", idA + ".console.log", events.KindLog, idA, "", false, false},
		{"logs", idA + ".console.idx", events.KindLog, idA, "", false, false},
		{"logs", idA + ".vmm.idx", events.KindLog, "", "", false, true},
		{"logs", idA + ".kernel.log", events.KindLog, "", "", false, true},
		{"logs", "notes.log", events.KindLog, "", "", false, true},
	}
	seen := map[events.ResourceKind]bool{events.KindWatchdogLog: true}
	for _, c := range cases {
		e := ParseEntry(c.dir, c.name, false)
		seen[e.Kind] = true
		if !slices.Contains(Kinds, e.Kind) {
			t.Errorf("%s/%s reads as %s, which Kinds does not list", c.dir, c.name, e.Kind)
		}
		if e.Kind != c.kind || e.ID != c.id || e.Handle != c.h || e.Legacy != c.legacy || e.Unparsed != c.unparsed {
			t.Errorf("%s/%s: got %+v", c.dir, c.name, e)
		}
	}
	for _, k := range Kinds {
		if !seen[k] {
			t.Errorf("Kinds lists %s, which no name above reads as", k)
		}
	}
	for _, c := range []struct {
		name, run string
		unparsed  bool
	}{
		{"run-r_1-x.watchdog.log", "r_1-x", false},
		{"run-" + idA + ".watchdog.log", idA, false},
		{"run-.watchdog.log", "", true},
		{"run-a.b.watchdog.log", "a.b", true}, // no run id has a '.'
	} {
		e := ParseEntry("logs", c.name, false)
		if e.Kind != events.KindWatchdogLog || e.Run != c.run || e.ID != "" || e.Unparsed != c.unparsed {
			t.Errorf("logs/%s: got %+v", c.name, e)
		}
	}
}

// The volumes exclusion is structural (RL-10): the boundary itself.
func TestDirsNeverIncludeVolumes(t *testing.T) {
	for _, d := range Dirs {
		if d == "volumes" || d == "images" || d == "caches" || strings.Contains(d, "/") {
			t.Fatalf("scan boundary includes %q", d)
		}
	}
}
