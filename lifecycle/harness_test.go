package lifecycle

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/supervisor"
	"github.com/nexus-sandbox/nexus/host/vmm/standin"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
)

// The flows' tests run the real flows against the harness below: an
// in-memory journal folded by the real projections (memJournal), and the
// test binary itself as the supervisor and the process driver's VMM
// (TestMain), each started as a real detached process by the production
// Spawner. No nexus binary, no root: what they need of the host is a
// temporary state root and e2fsprogs.

// childEnv marks a process this test binary started as a supervisor or VMM.
const childEnv = "NEXUS_LIFECYCLE_TEST_CHILD"

// slowEnv makes the VMM and supervisor roles never bind their sockets,
// as they do for a while after their spawn on a loaded machine.
const slowEnv = "NEXUS_LIFECYCLE_TEST_SLOW"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" && len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-test.") {
		os.Exit(serveRole(os.Args[1], os.Args[2:]))
	}
	os.Setenv(childEnv, "1") // inherited by every process a test spawns
	// A race-enabled child otherwise sleeps a second as it exits, which
	// every stop would wait for.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}

// serveRole is what `nexus supervisor` and `nexus vmm-process` do
// (cmd/nexus/hidden.go), on the same flags; "die" exits at once, a
// process that dies before it answers.
func serveRole(role string, args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	var err error
	switch role {
	case driver.ProcessCommand:
		api := fs.String(driver.APISocketFlag, "", "")
		if err = fs.Parse(args); err == nil {
			if os.Getenv(slowEnv) != "" {
				// A VMM still starting: it has its command line, no socket yet.
				<-ctx.Done()
				return 0
			}
			err = standin.Serve(ctx, *api, os.Stderr, proc.ReadyHook())
		}
	case supervisor.Command:
		o := supervisor.ServeOptions{Now: time.Now, Log: os.Stderr, Ready: proc.ReadyHook()}
		fs.StringVar(&o.SandboxID, supervisor.SandboxFlag, "", "")
		fs.StringVar(&o.StateDir, supervisor.StateDirFlag, "", "")
		fs.StringVar(&o.IIDSocket, supervisor.IIDSocketFlag, "", "")
		fs.StringVar(&o.ConsoleLog, supervisor.ConsoleLogFlag, "", "")
		fs.StringVar(&o.ConsoleIndex, supervisor.ConsoleIndexFlag, "", "")
		if err = fs.Parse(args); err == nil {
			if os.Getenv(slowEnv) != "" {
				// A supervisor still starting: no socket yet.
				<-ctx.Done()
				return 0
			}
			err = supervisor.Serve(ctx, o)
		}
	case "hang":
		// A process that starts and never serves: it says so, then waits
		// to be killed.
		fmt.Fprintln(os.Stderr, "starting, never serving")
		<-ctx.Done()
	case "idle":
		// A process whose command line (the arguments after the role)
		// names what the test wants named, until SIGTERM; unlike a shell
		// running sleep, it forks no child that carries the same command
		// line between fork and exec.
		<-ctx.Done()
	default:
		err = fmt.Errorf("role %q: dying before answering, as asked", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// memJournal is a Backend whose journal is a slice: every event is
// encoded and decoded by the real codec, folded by the real projections,
// and refused as the store refuses it (a stale expectation, an event of a
// saga that is not open).
type memJournal struct {
	mu        sync.Mutex
	recs      []events.Record
	sandboxes *projections.Sandboxes
	volumes   *projections.Volumes
	sagas     *projections.Sagas
	images    *projections.ImageCache
	// fail, if set, is asked before each event is appended; an error is
	// the append's, as a journal that could not take it returns one.
	fail func(events.Event) error
	// lists counts the answers that held every sandbox (Sandboxes).
	lists atomic.Int64
}

func newMemJournal() *memJournal {
	return &memJournal{sandboxes: projections.NewSandboxes(), volumes: projections.NewVolumes(),
		sagas: projections.NewSagas(), images: projections.NewImageCache()}
}

func (j *memJournal) Append(ctx context.Context, evs ...events.Event) ([]uint64, error) {
	return j.AppendExpect(ctx, nil, evs...)
}

func (j *memJournal) AppendExpect(_ context.Context, expect []core.Expect, evs ...events.Event) ([]uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	n, refusal := core.Admit(memLedger{j}, expect, evs)
	var stale *core.StaleError
	if errors.As(refusal, &stale) && stale.Actual > 0 {
		stale.Latest = j.recs[stale.Actual-1].Event.Type
	}
	var seqs []uint64
	for _, e := range evs[:n] {
		if j.fail != nil {
			if err := j.fail(e); err != nil {
				return seqs, err
			}
		}
		data, err := events.Encode(e)
		if err != nil {
			return seqs, err
		}
		if e, err = events.Decode(data); err != nil {
			return seqs, err
		}
		seq := uint64(len(j.recs) + 1)
		j.recs = append(j.recs, events.Record{Seq: seq, Event: e})
		j.sandboxes.Apply(seq, e)
		j.volumes.Apply(seq, e)
		j.sagas.Apply(seq, e)
		j.images.Apply(seq, e)
		seqs = append(seqs, seq)
	}
	return seqs, refusal
}

func (j *memJournal) Rev(_ context.Context, entity core.Entity) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return memLedger{j}.Rev(entity)
}

// memLedger is the journal as core.Admit reads it; j.mu is held.
type memLedger struct{ j *memJournal }

func (l memLedger) Rev(entity core.Entity) (uint64, error) {
	switch entity.Kind() {
	case "sandbox":
		if sb := l.j.sandboxes.Get(entity.Name()); sb != nil {
			return sb.Rev, nil
		}
	case "volume":
		if v := l.j.volumes.Get(entity.Name()); v != nil {
			return v.Rev, nil
		}
		for i := len(l.j.recs) - 1; i >= 0; i-- {
			if name, own := events.VolumeOf(l.j.recs[i].Event); own && name == entity.Name() {
				return l.j.recs[i].Seq, nil
			}
		}
	case "handle":
		for i := len(l.j.recs) - 1; i >= 0; i-- {
			if c, ok := l.j.recs[i].Event.Payload.(events.HandleClaimedEvent); ok && c.Handle == entity.Name() {
				return l.j.recs[i].Seq, nil
			}
		}
	}
	return 0, nil
}

func (l memLedger) SagaOpen(id string) bool { return l.j.sagas.Get(id) != nil }

func (l memLedger) Holder(handle string) (string, error) {
	if sb := l.j.sandboxes.ByHandle(handle); sb != nil {
		return sb.ID, nil
	}
	return "", nil
}

func (j *memJournal) Events(ctx context.Context, q events.Query, fn func(events.Record) error) error {
	j.mu.Lock()
	recs := slices.Clone(j.recs)
	j.mu.Unlock()
	types := append(slices.Clone(q.Types), q.Type)
	match := func(t events.Type) bool {
		for _, want := range types {
			if want == "" || string(t) == want || strings.HasPrefix(string(t), want+".") {
				return true
			}
		}
		return false
	}
	var out []events.Record
	for _, r := range recs {
		if r.Seq < q.Since || (q.Until != 0 && r.Seq > q.Until) || (q.Sandbox != "" && r.Event.Sandbox != q.Sandbox) || !match(r.Event.Type) {
			continue
		}
		out = append(out, r)
	}
	if q.Tail > 0 && len(out) > q.Tail {
		out = out[len(out)-q.Tail:]
	}
	for _, r := range out {
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// clone hands a caller its own copy, as a daemon's answer is.
func clone[T any](v T) T {
	data, err := msgpack.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out T
	if err := msgpack.Unmarshal(data, &out); err != nil {
		panic(err)
	}
	return out
}

func (j *memJournal) Sandboxes(context.Context) ([]projections.Sandbox, error) {
	j.lists.Add(1)
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []projections.Sandbox
	for _, sb := range j.sandboxes.List() {
		out = append(out, clone(*sb))
	}
	return out, nil
}

func (j *memJournal) WithProcesses(context.Context) ([]projections.Sandbox, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []projections.Sandbox
	for _, sb := range j.sandboxes.List() {
		if sb.HasProcess() {
			out = append(out, clone(*sb))
		}
	}
	return out, nil
}

func (j *memJournal) Sandbox(_ context.Context, ref string) (projections.Sandbox, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	sb := j.sandboxes.Get(strings.ToUpper(ref))
	if sb == nil && ref != "" {
		sb = j.sandboxes.ByHandle(ref)
	}
	if sb == nil {
		return projections.Sandbox{}, false, nil
	}
	return clone(*sb), true, nil
}

func (j *memJournal) Named(_ context.Context, ref string) ([]projections.Ref, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.sandboxes.Named(ref), nil
}

// SnapshotOwner is the sandbox holding snapshot snap (an exact ID): the
// per-entity read control's backends serve and lifecycle asserts for.
func (j *memJournal) SnapshotOwner(_ context.Context, snap string) (projections.Sandbox, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, sb := range j.sandboxes.List() {
		if slices.Contains(sb.Snapshots, snap) {
			return clone(*sb), true, nil
		}
	}
	return projections.Sandbox{}, false, nil
}

func (j *memJournal) SnapshotsNamed(_ context.Context, ref string) ([]projections.SnapshotRef, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.sandboxes.SnapshotsNamed(ref), nil
}

func (j *memJournal) OpenSagas(context.Context) ([]projections.OpenSaga, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []projections.OpenSaga
	for _, sg := range j.sagas.Open() {
		out = append(out, clone(*sg))
	}
	return out, nil
}

func (j *memJournal) Volumes(context.Context) ([]projections.Volume, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []projections.Volume
	for _, v := range j.volumes.List() {
		out = append(out, clone(*v))
	}
	return out, nil
}

func (j *memJournal) ImageCache(context.Context) (projections.ImageCacheState, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return clone(j.images.State(projections.CacheUsers(j.sandboxes.List()))), nil
}

func (j *memJournal) Bootstrap(_ context.Context, id string) (events.Bootstrap, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if sb := j.sandboxes.Get(id); sb != nil {
		return sb.Bootstrap, nil
	}
	return events.Bootstrap{}, nil
}

func (j *memJournal) OwnerOf(_ context.Context, paths []string, except string) (string, string, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	sb, p, found := j.sandboxes.OwnerOf(paths, except)
	return sb, p, found, nil
}

func (j *memJournal) PathOwners(_ context.Context, paths []string) ([]string, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i], _ = j.sandboxes.PathOwner(p)
	}
	return out, nil
}

// since returns the events journaled after mark (a len of the journal).
func (j *memJournal) since(mark int) []events.Event {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []events.Event
	for _, r := range j.recs[mark:] {
		out = append(out, r.Event)
	}
	return out
}

func (j *memJournal) mark() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.recs)
}

// failType makes every append of an event of type t fail with err.
func (j *memJournal) failType(t events.Type, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.fail = func(e events.Event) error {
		if e.Type == t {
			return err
		}
		return nil
	}
}

// testLauncher is the Spawner with the test binary as the nexus binary,
// and failures on demand: a launch refused before anything starts, or a
// process that dies before it answers.
type testLauncher struct {
	mu       sync.Mutex
	launched []string
	refuse   map[string]error // by Launch.What
	die      map[string]bool  // by Launch.What
}

func (l *testLauncher) Launch(ctx context.Context, x Launch) (proc.Identity, error) {
	l.mu.Lock()
	l.launched = append(l.launched, x.What)
	refuse, die := l.refuse[x.What], l.die[x.What]
	l.mu.Unlock()
	if refuse != nil {
		return proc.Identity{}, refuse
	}
	argv := append([]string{os.Args[0]}, x.Argv[1:]...)
	if die {
		argv = []string{os.Args[0], "die", x.Log} // the log names the root, for ShortRoot's cleanup
	}
	x.Argv = argv
	return Spawner{}.Launch(ctx, x)
}

func (l *testLauncher) count(what string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, w := range l.launched {
		if w == what {
			n++
		}
	}
	return n
}

// flow is one test's manager, journal, launcher and state root.
type flow struct {
	t    *testing.T
	m    *Manager
	j    *memJournal
	l    *testLauncher
	root string
	ctx  context.Context
}

func newFlow(t *testing.T) *flow {
	t.Helper()
	root := testutil.ShortRoot(t)
	j := newMemJournal()
	l := &testLauncher{refuse: map[string]error{}, die: map[string]bool{}}
	m := &Manager{Root: layout.Root(root), B: j, Launcher: l,
		Driver:     driver.Driver{Name: driver.Process, Exe: "/nonexistent/nexus"},
		OverlayMiB: 32, StartTimeout: testutil.Scale(10 * time.Second),
		// Most flows here walk the private copy's steps (os-disk and its
		// undo); overlayFlow makes a manager whose roots are overlays.
		RootMode: events.RootCopy}
	f := &flow{t: t, m: m, j: j, l: l, root: root, ctx: context.Background()}
	// Stop what the journal says runs, so it cleans up after itself
	// (ShortRoot's cleanup, which runs after this, SIGKILLs the rest).
	t.Cleanup(func() {
		list, _ := j.Sandboxes(context.Background())
		for _, sb := range list {
			f.killProcesses(sb.ID)
		}
	})
	return f
}

// overlayFlow is newFlow whose new sandboxes boot on the shared cache
// entry under an overlay root, as the process driver's guests do by
// default.
func overlayFlow(t *testing.T) *flow {
	f := newFlow(t)
	f.m.RootMode = ""
	return f
}

// image writes a small raw image outside the state root.
func (f *flow) image() string {
	f.t.Helper()
	path := filepath.Join(f.t.TempDir(), "base.img")
	if err := os.WriteFile(path, []byte("an OS image, sector 0 and all"), 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Truncate(path, 4<<20); err != nil {
		f.t.Fatal(err)
	}
	return path
}

// create makes a running sandbox (failing the test if it cannot).
func (f *flow) create(spec CreateSpec) projections.Sandbox {
	f.t.Helper()
	if spec.Image == "" {
		spec.Image = f.image()
	}
	sb, err := f.m.Create(f.ctx, spec)
	if err != nil {
		f.t.Fatalf("create: %v", err)
	}
	return sb
}

// killProcesses stops whatever the journal says sandbox id still runs
// (ShortRoot's cleanup would SIGKILL it anyway; this lets it clean up).
func (f *flow) killProcesses(id string) {
	sb, found, _ := f.j.Sandbox(context.Background(), id)
	if !found {
		return
	}
	for _, p := range []*projections.Process{sb.VMM, sb.Supervisor} {
		if p != nil {
			proc.Terminate(proc.Identity{Pid: p.Pid, StartTicks: p.StartTicks}, time.Second)
		}
	}
}

func (f *flow) find(id string) (projections.Sandbox, bool) {
	f.t.Helper()
	sb, found, err := f.j.Sandbox(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return sb, found
}

// exists reports whether rel exists beneath the root (a link counts).
func (f *flow) exists(rel string) bool {
	_, err := os.Lstat(filepath.Join(f.root, rel))
	return err == nil
}

// files lists every path beneath dirs of the root (relative), sorted.
func (f *flow) files(dirs ...string) []string {
	f.t.Helper()
	var out []string
	for _, d := range dirs {
		filepath.WalkDir(filepath.Join(f.root, d), func(p string, _ os.DirEntry, err error) error {
			if err == nil && p != filepath.Join(f.root, d) {
				rel, _ := filepath.Rel(f.root, p)
				out = append(out, rel)
			}
			return nil
		})
	}
	slices.Sort(out)
	return out
}

// types lists the types of evs, with the step of each saga event after a
// colon, so a test reads a flow's journal as a list of lines.
func types(evs []events.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, string(e.Type))
	}
	return out
}

// steps lists the saga step names of evs ("" steps left out, duplicates
// kept), in journal order.
func steps(evs []events.Event) []string {
	var out []string
	for _, e := range evs {
		if e.Step != "" {
			out = append(out, e.Step)
		}
	}
	return out
}

func ofType(evs []events.Event, t events.Type) []events.Event {
	var out []events.Event
	for _, e := range evs {
		if e.Type == t {
			out = append(out, e)
		}
	}
	return out
}

// alive reports whether the process p names runs (pid and start time).
func alive(p *projections.Process) bool {
	if p == nil {
		return false
	}
	ok, err := proc.Alive(proc.Identity{Pid: p.Pid, StartTicks: p.StartTicks})
	return err == nil && ok
}

func wantErr(t *testing.T, err error, target error, contains ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", target)
	}
	if target != nil && !errors.Is(err, target) {
		t.Fatalf("error %q is not %v", err, target)
	}
	for _, c := range contains {
		if !strings.Contains(err.Error(), c) {
			t.Fatalf("error %q does not say %q", err, c)
		}
	}
}

// removeAll deletes rel beneath root, behind nexus's back.
func removeAll(root, rel string) error { return os.RemoveAll(filepath.Join(root, rel)) }
