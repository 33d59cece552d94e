package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/imagecache"
	"github.com/nexus-sandbox/nexus/host/intent"
	"github.com/nexus-sandbox/nexus/host/supervisor"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// Shadow is a --shadow NAME=SRC: a per-sandbox copy of SRC (an image file,
// or a directory turned into an ext4 image), keyed by the sandbox handle.
type Shadow struct{ Name, Source string }

// Mount is a --volume NAME:GUESTPATH.
type Mount struct{ Name, GuestPath string }

// CreateSpec is what `nexus create` asks for.
type CreateSpec struct {
	Image     string
	Handle    string
	Workspace string
	Shadows   []Shadow
	Volumes   []Mount
	Force     bool // skip the disk-space preflight
	// Labels are the sandbox's labels (checked by projections.ParseLabels).
	Labels events.Labels
	// Cpus and MemoryBytes size the guest (zero: DefaultCpus,
	// DefaultMemory); the caller has checked them against the host.
	Cpus        int
	MemoryBytes int64
	// ID, when set, is the new sandbox's ULID, chosen by the caller so it
	// can be written to a client ledger before the create starts.
	ID string
}

// validHandle is the form of a handle, ^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$
// (the ".." a handle may not hold is decideHandle's), and ValidName the
// form of a shadow disk's or volume's name, ^[a-z0-9][a-z0-9_-]{0,62}$,
// each checked byte by byte: compiled, their bounded repeats are large
// programs, which a command checking one would build first.
func validHandle(s string) bool {
	return validForm(s, 128, func(c byte) bool { return isAlnum(c) }, func(c byte) bool {
		return isAlnum(c) || c == '.' || c == '_' || c == '/' || c == '-'
	})
}

// ValidName reports whether s may name a shadow disk or a volume.
func ValidName(s string) bool {
	lowerOrDigit := func(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }
	return validForm(s, 63, lowerOrDigit, func(c byte) bool { return lowerOrDigit(c) || c == '_' || c == '-' })
}

// validForm is whether s is one byte that first allows, then at most
// limit-1 bytes that rest allows.
func validForm(s string, limit int, first, rest func(byte) bool) bool {
	if len(s) == 0 || len(s) > limit || !first(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !rest(s[i]) {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// workspaceSlack is room left in a workspace image beyond its contents.
const workspaceSlack = 64 << 20

// Create runs the create saga and boots the sandbox.
func (m *Manager) Create(ctx context.Context, spec CreateSpec) (projections.Sandbox, error) {
	plan, err := m.planCreate(ctx, spec)
	if err != nil {
		return projections.Sandbox{}, err
	}
	// The cache lease is shared from before the entry is prepared until the
	// commit naming it is journaled: a prune either sees the reference or
	// cannot take the lease.
	cache, err := m.shareCache(ctx)
	if err != nil {
		return projections.Sandbox{}, err
	}
	defer cache.Release()
	id := spec.ID
	if id == "" {
		id = ulid.Make().String()
	}
	s := m.saga(events.SagaCreate, id, nil)
	hold, expect, err := m.holdNew(ctx, events.SagaCreate, id, spec.Volumes, false)
	if err != nil {
		return projections.Sandbox{}, err
	}
	defer hold.release()
	s.Expect = append(expect, plan.handle...)
	m.decided(events.SagaCreate)

	// Intents come first, before saga.started: from the moment the journal
	// names this sandbox, a leased marker on disk says its creator lives.
	covers := plan.covers(m, id)
	for _, sh := range spec.Shadows {
		covers = append(covers, m.rel(m.Root.ShadowDisk(spec.Handle, sh.Name)))
	}
	held, intents, err := m.publishIntents(hold, id, s.ID, spec.Handle, covers)
	if err != nil {
		return projections.Sandbox{}, err
	}
	defer releaseAll(held)
	m.published(events.SagaCreate)

	// An overlay root boots on the cache entry itself: no OS disk of the
	// sandbox's own is written, on a miss or a hit.
	var tee *teedDisk
	if plan.bootCfg.Root == events.RootCopy {
		tee = &teedDisk{path: m.Root.RawDisk(id)}
	}
	var journaled bool
	s.Steps = append(s.Steps, m.intentsStep(held, intents, &journaled), m.imageCacheStep(plan, tee))
	s.Steps = append(s.Steps, m.materialiseSteps(id, spec, plan, tee)...)
	s.Steps = append(s.Steps, m.commitStep(id, func(resources []events.Resource) events.Payload {
		return events.SandboxCreatedEvent{Handle: spec.Handle, Image: plan.image, Driver: m.Driver.Name, Resources: resources, Bootstrap: plan.boot,
			Boot: plan.bootCfg, Labels: spec.Labels}
	}))
	retire := m.retireStep(held, intents)
	// The markers' removal is journaled with what follows: a crash before
	// that append is one before retire-intents was journaled, and recover
	// retires whatever is left (retireLeftoverIntents).
	retire.Defer = true
	retireDo := retire.Do
	retire.Do = func(ctx context.Context) ([]events.Payload, error) {
		cache.Release() // the commit, and with it the reference, is journaled
		return retireDo(ctx)
	}
	s.Steps = append(s.Steps, retire)
	s.Steps = append(s.Steps, m.attachSteps(spec.Volumes, false)...)
	s.Steps = append(s.Steps, m.bootSteps(id, "")...)
	if err := s.Run(ctx, m.B); err != nil {
		if !journaled {
			dropIntents(m, hold, held, intents)
		}
		return projections.Sandbox{}, m.handleTaken(ctx, spec.Handle, id, err)
	}
	sb, err := m.writeRecord(ctx, id)
	if err != nil {
		return projections.Sandbox{}, err
	}
	return sb, nil
}

type createPlan struct {
	// handle is the expectation of the handle the create gives, as its
	// decision saw it (none without a handle).
	handle         []core.Expect
	image          string
	boot           events.Bootstrap // the cache entry the OS disk is (or is cloned from)
	bootCfg        events.BootConfig
	workspaceBytes int64
	shadowIsDir    map[string]bool
}

func (p createPlan) covers(m *Manager, id string) []string {
	covers := []string{m.rel(m.Root.WorkspaceDisk(id)), m.rel(m.Root.SupervisorDir(id)), m.rel(filepath.Dir(m.Root.Record(id)))}
	if p.bootCfg.Root == events.RootCopy {
		covers = append(covers, m.rel(m.Root.RawDisk(id)))
	}
	return covers
}

// planCreate checks everything it can before anything is written:
// arguments, the kernel, and the disk space the new disks will take.
func (m *Manager) planCreate(ctx context.Context, spec CreateSpec) (createPlan, error) {
	plan := createPlan{shadowIsDir: map[string]bool{}}
	refuse := func(format string, a ...any) (createPlan, error) {
		return plan, fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, a...))
	}
	var err error
	if plan.bootCfg, err = m.newBoot(spec.Cpus, spec.MemoryBytes); err != nil {
		return plan, err
	}
	if spec.Image == "" {
		return refuse("--image is required")
	}
	// Judged once: from here on the image is the resolved path, read and
	// recorded as such.
	var image string
	image, err = fsx.Input(string(m.Root), spec.Image)
	if err != nil {
		return refuse("image: %v", err)
	}
	if err := imagecache.CheckRaw(image); err != nil {
		return refuse("image: %v", err)
	}
	plan.image = image
	if spec.ID != "" {
		if !layout.IsULID(spec.ID) {
			return refuse("id %q is not a canonical ULID", spec.ID)
		}
		if _, err := m.Find(ctx, spec.ID); err == nil {
			return refuse("id %q is already in use", spec.ID)
		}
	}
	if plan.boot.Identity, plan.boot.CacheID, err = imagecache.IdentityOf(image); err != nil {
		return refuse("%v", err)
	}
	if plan.handle, err = m.decideHandle(ctx, spec.Handle); err != nil {
		return plan, err
	}
	if len(spec.Shadows) > 0 && spec.Handle == "" {
		return refuse("--shadow needs --handle: shadow disks are keyed by the sandbox handle")
	}
	if err := m.refuseHandleCollision(ctx, spec); err != nil {
		return plan, err
	}
	seen := map[string]bool{}
	var need int64
	for _, sh := range spec.Shadows {
		if !ValidName(sh.Name) || seen[sh.Name] {
			return refuse("shadow name %q: want a unique lowercase name", sh.Name)
		}
		seen[sh.Name] = true
		info, err := os.Lstat(sh.Source)
		if err != nil {
			return refuse("shadow %s: %v", sh.Name, err)
		}
		switch {
		case info.IsDir():
			plan.shadowIsDir[sh.Name] = true
			size, err := treeBytes(sh.Source)
			if err != nil {
				return refuse("shadow %s: %v", sh.Name, err)
			}
			need += size + workspaceSlack
		case info.Mode().IsRegular():
			size, err := disk.Stat(sh.Source)
			if err != nil {
				return refuse("shadow %s: %v", sh.Name, err)
			}
			need += size.Allocated
		default:
			return refuse("shadow %s: %s is neither a regular file nor a directory", sh.Name, sh.Source)
		}
	}
	plan.workspaceBytes = m.overlayBytes()
	if spec.Workspace != "" {
		info, err := os.Stat(spec.Workspace)
		if err != nil {
			return refuse("--workspace: %v", err)
		}
		if !info.IsDir() {
			return refuse("--workspace %s is not a directory", spec.Workspace)
		}
		size, err := treeBytes(spec.Workspace)
		if err != nil {
			return refuse("--workspace: %v", err)
		}
		plan.workspaceBytes = max(plan.workspaceBytes, roundMiB(2*size+workspaceSlack))
		need += size + workspaceSlack
	}
	if err := m.checkVolumes(ctx, spec.Volumes); err != nil {
		return plan, err
	}
	// Every sandbox's API socket has the length of any other's.
	if err := m.Driver.Preflight(m.Root.APISocket(cmp.Or(spec.ID, ulid.Make().String()))); err != nil {
		return plan, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if err := m.ensureDirs("disks", "run", "supervisors", "sandboxes", "logs", "images"); err != nil {
		return plan, err
	}
	imageSize, err := disk.Stat(image)
	if err != nil {
		return refuse("image: %v", err)
	}
	hit, _ := fsx.Lexists(string(m.Root), m.rel(m.Root.ImageEntry(plan.boot.CacheID)))
	need += osDiskCost(m.Root, image, imageSize.Allocated, hit, plan.bootCfg.Root == events.RootOverlay)
	if !spec.Force {
		if err := disk.Preflight(m.Root.Disks(), need); err != nil {
			return plan, fmt.Errorf("%w: %v (--force skips this check)", ErrRefused, err)
		}
	}
	return plan, nil
}

// osDiskCost is the data blocks an OS disk of an image allocating
// imageBytes takes. An overlay root boots on the entry: a hit writes
// nothing, a miss the entry alone. A private copy is a clone of the entry
// on a hit; on a miss the entry and the disk are both clones of the image
// (disk.CloneEach). A FICLONE shares extents and allocates none, so where
// the state root's filesystem reflinks (probed once per filesystem) a
// clone is charged nothing: a create there is not refused for space it
// will not use. The image itself reflinks only when it is on that
// filesystem too.
func osDiskCost(root layout.Root, image string, imageBytes int64, hit, overlay bool) int64 {
	cow := disk.Reflinks(root.Disks()) && disk.SameFilesystem(root.Disks(), root.Images())
	switch {
	case overlay && hit:
		return 0
	case overlay && disk.Reflinks(root.Images()) && disk.SameFilesystem(image, root.Images()):
		return 0
	case overlay:
		return imageBytes
	case hit && cow:
		return 0
	case hit:
		return imageBytes
	case cow && disk.SameFilesystem(image, root.Disks()):
		return 0
	default:
		return 2 * imageBytes // the entry, and the disk from the same read
	}
}

func (m *Manager) checkVolumes(ctx context.Context, mounts []Mount) error {
	if len(mounts) == 0 {
		return nil
	}
	vols, err := m.B.Volumes(ctx)
	if err != nil {
		return err
	}
	byName := map[string]projections.Volume{}
	for _, v := range vols {
		byName[v.Name] = v
	}
	seen := map[string]bool{}
	for _, mt := range mounts {
		v, ok := byName[mt.Name]
		switch {
		case !ok:
			return fmt.Errorf("%w: no volume %q (create it with `nexus volume create`)", ErrNotFound, mt.Name)
		case seen[mt.Name]:
			return fmt.Errorf("%w: volume %q given twice", ErrRefused, mt.Name)
		case len(v.AttachedTo) > 0:
			return fmt.Errorf("%w: volume %q is attached to %s; a writable volume is never shared", ErrRefused, mt.Name, strings.Join(v.AttachedTo, ", "))
		case !strings.HasPrefix(mt.GuestPath, "/"):
			return fmt.Errorf("%w: volume %q: guest path %q is not absolute", ErrRefused, mt.Name, mt.GuestPath)
		case strings.ContainsFunc(mt.GuestPath, func(r rune) bool { return unicode.IsSpace(r) || r == '"' || !unicode.IsPrint(r) }):
			// The path travels on the guest kernel's command line
			// (nexus.mount=SERIAL:/path), which splits on white space.
			return fmt.Errorf("%w: volume %q: guest path %q has white space, a quote or a control character", ErrRefused, mt.Name, mt.GuestPath)
		}
		seen[mt.Name] = true
	}
	return nil
}

type publishedIntent struct {
	res    events.Resource
	covers []string
}

// publishIntents takes the shadow intent first (shadow disks are written
// before anything else can name them, and the reaper correlates them by
// handle, which the create intent cannot answer for), then the create
// intent.
func (m *Manager) publishIntents(hold *newHold, id, saga, handle string, covers []string) ([]*intent.Held, []publishedIntent, error) {
	var held []*intent.Held
	var out []publishedIntent
	type want struct {
		kind   events.ResourceKind
		path   string
		covers []string
	}
	var wants []want
	if handle != "" {
		wants = append(wants, want{events.KindShadowIntent, m.Root.ShadowIntent(handle), nil})
	}
	wants = append(wants, want{events.KindCreateIntent, m.Root.CreateIntent(id), covers})
	for _, w := range wants {
		h, err := intent.Publish(w.path, intent.Intent{Kind: string(w.kind), Sandbox: id, Handle: handle, Saga: saga, Covers: w.covers})
		if err != nil {
			dropIntents(m, hold, held, out)
			if !errors.Is(err, fs.ErrExist) {
				// A publish that failed after its link or rename leaves
				// a marker no one retires: keep the trace to it.
				hold.left = true
				return nil, nil, err
			}
			// What is there may be no intent at all: a link or a special
			// file is named as what it is, not as a create.
			if fi, serr := fsx.Stat(filepath.Dir(w.path), filepath.Base(w.path)); serr != nil {
				return nil, nil, fmt.Errorf("%w: %v; it is not an intent nexus wrote: remove it", ErrRefused, serr)
			} else if !fi.Mode().IsRegular() {
				return nil, nil, fmt.Errorf("%w: %s is a %s, not an intent nexus wrote: remove it", ErrRefused, w.path, strings.TrimPrefix(fsx.TypeOf(fi.Mode()), "a "))
			}
			by := ""
			if in, rerr := intent.Read(w.path); rerr == nil && in.Sandbox != "" {
				by = "sandbox " + in.Sandbox + "; "
			}
			return nil, nil, fmt.Errorf("%w: %s exists: another create of this handle is in flight or crashed (%srun `nexus recover`)", ErrRefused, w.path, by)
		}
		held = append(held, h)
		out = append(out, publishedIntent{res: m.res(w.kind, w.path), covers: w.covers})
	}
	return held, out, nil
}

// intentsStep journals intents already published and leased; its undo
// releases and retires them, after every later step has been undone. It
// sets *ran once it has run: from then on a failure's compensation retires
// the intents, and before it the caller must (dropIntents).
func (m *Manager) intentsStep(held []*intent.Held, intents []publishedIntent, ran *bool) sagas.Step {
	return sagas.Step{
		Name: "intents",
		Do: func(context.Context) ([]events.Payload, error) {
			*ran = true
			var ps []events.Payload
			for _, in := range intents {
				ps = append(ps, events.IntentWrittenEvent{Resource: in.res, Covers: in.covers})
			}
			return ps, nil
		},
		Undo: func(context.Context) ([]events.Payload, error) { return m.retireIntents(held, intents) },
	}
}

func releaseAll(held []*intent.Held) {
	for _, h := range held {
		h.Release()
	}
}

func (m *Manager) retireIntents(held []*intent.Held, intents []publishedIntent) ([]events.Payload, error) {
	releaseAll(held)
	var ps []events.Payload
	for _, in := range intents {
		if ok, _ := fsx.Lexists(string(m.Root), in.res.Path); !ok {
			continue // retired already (compensation after commit)
		}
		if err := intent.Retire(m.Root.Abs(in.res.Path)); err != nil {
			return ps, err
		}
		ps = append(ps, events.IntentRetiredEvent{Resource: in.res})
	}
	return ps, nil
}

// materialiseSteps writes the sandbox's disks and supervisor state.
func (m *Manager) materialiseSteps(id string, spec CreateSpec, plan createPlan, tee *teedDisk) []sagas.Step {
	raw := m.res(events.KindRawDisk, m.Root.RawDisk(id))
	ws := m.res(events.KindWorkspaceDisk, m.Root.WorkspaceDisk(id))
	osDisk := m.diskStep("os-disk", raw, func(dst string) (disk.Method, error) {
		// From the cache entry, not the image: the entry is what the commit
		// records as the bootstrap, and the image may change meanwhile.
		return m.clone("os disk of "+id, m.Root.ImageDisk(plan.boot.CacheID), dst)
	})
	cloneDo, cloneUndo := osDisk.Do, osDisk.Undo
	osDisk.Do = func(ctx context.Context) ([]events.Payload, error) {
		if tee.method == "" {
			return cloneDo(ctx)
		}
		// The image-cache step wrote it from the same read as the entry
		// (a miss): it is this saga's, and a copy of the entry.
		tee.adopted = true
		size, err := disk.Stat(tee.path)
		if err != nil {
			return nil, err
		}
		return sagas.One(events.DiskMaterialisedEvent{Resource: raw, Method: string(tee.method), AllocatedBytes: size.Allocated, ApparentBytes: size.Apparent}), nil
	}
	osDisk.Undo = func(ctx context.Context) ([]events.Payload, error) {
		if tee.adopted {
			return m.reclaim(raw, false, "compensation")
		}
		return cloneUndo(ctx)
	}
	var steps []sagas.Step
	if plan.bootCfg.Root == events.RootCopy {
		steps = append(steps, osDisk)
	}
	steps = append(steps,
		m.diskStep("workspace-disk", ws, func(dst string) (disk.Method, error) {
			if spec.Workspace != "" {
				return disk.MethodMkfs, disk.MakeExt4(dst, plan.workspaceBytes, spec.Workspace)
			}
			// An empty workspace is a clone of the template of its size
			// (made once, under the cache lease this create holds shared):
			// a FICLONE or a copy of a few MiB of metadata, not a mkfs.ext4
			// process per create.
			tmpl, _, err := imagecache.Template(m.Root, plan.workspaceBytes)
			if err != nil {
				return "", err
			}
			return disk.Clone(tmpl, dst)
		}))
	for _, sh := range spec.Shadows {
		sh := sh
		r := m.res(events.KindShadowDisk, m.Root.ShadowDisk(spec.Handle, sh.Name))
		steps = append(steps, m.diskStep("shadow."+sh.Name, r, func(dst string) (disk.Method, error) {
			if plan.shadowIsDir[sh.Name] {
				size, err := treeBytes(sh.Source)
				if err != nil {
					return "", err
				}
				return disk.MethodMkfs, disk.MakeExt4(dst, roundMiB(2*size+workspaceSlack), sh.Source)
			}
			return m.clone("shadow "+sh.Name+" of "+id, sh.Source, dst)
		}))
	}
	// Every one of them is covered by the create intent, published and
	// leased before the saga: recovering a crash before the journal hears
	// of them deletes what the intent covers, journaled or not
	// (undoUncommitted). So their events wait for the record dir's, and
	// the commit, which reads them back, follows that one append.
	steps = append(steps, m.supervisorStateStep(id, ""))
	for i := range steps {
		steps[i].Defer = true
	}
	return append(steps, m.recordDirStep(id))
}

// diskStep materialises one disk; its undo deletes it, but only if this
// step created it: a path that was there before, or
// that make found there (it creates dst with O_EXCL: disk.Clone,
// disk.MakeExt4, so fs.ErrExist means someone else's file), is left alone.
func (m *Manager) diskStep(name string, r events.Resource, make func(dst string) (disk.Method, error)) sagas.Step {
	made := false
	return sagas.Step{
		Name: name,
		Do: func(context.Context) ([]events.Payload, error) {
			switch there, err := fsx.Lexists(string(m.Root), r.Path); {
			case err != nil:
				return nil, err
			case there:
				return nil, fmt.Errorf("%s exists and is not this saga's (run `nexus reap` to see whose it is): %w", m.Root.Abs(r.Path), fs.ErrExist)
			}
			method, err := make(m.Root.Abs(r.Path))
			made = !errors.Is(err, fs.ErrExist)
			if err != nil {
				return nil, err
			}
			size, err := disk.Stat(m.Root.Abs(r.Path))
			if err != nil {
				return nil, err
			}
			return sagas.One(events.DiskMaterialisedEvent{Resource: r, Method: string(method), AllocatedBytes: size.Allocated, ApparentBytes: size.Apparent}), nil
		},
		Undo: func(context.Context) ([]events.Payload, error) {
			if !made {
				return nil, nil
			}
			return m.reclaim(r, false, "compensation")
		},
	}
}

// supervisorStateStep creates supervisors/<id>/ (0700) and its MITM CA,
// minted once here and re-seeded into every later supervisor.
// A fork or restore child seeds from the parent's CA so TLS sessions the
// guest trusts keep validating.
func (m *Manager) supervisorStateStep(id, seedFrom string) sagas.Step {
	r := m.res(events.KindSupervisorState, m.Root.SupervisorDir(id))
	return sagas.Step{
		Name: "supervisor-state",
		Do: func(context.Context) ([]events.Payload, error) {
			dir := m.Root.SupervisorDir(id)
			// fsx first: supervisors/ or supervisors/<id> being a link is refused.
			if err := fsx.MkdirAll(string(m.Root), dir, 0o700); err != nil {
				return nil, err
			}
			if err := supervisor.EnsureStateDir(dir); err != nil {
				return nil, err
			}
			if seedFrom != "" {
				if ca, err := supervisor.LoadCA(m.Root.SupervisorDir(seedFrom), nowUTC()); err == nil {
					if err := supervisor.SaveCA(dir, ca); err != nil {
						return nil, err
					}
				}
			}
			if _, _, err := supervisor.SeedOrMint(dir, id, nowUTC()); err != nil {
				return nil, err
			}
			return sagas.One(events.ResourceCreatedEvent{Resource: r}), nil
		},
		Undo: func(context.Context) ([]events.Payload, error) { return m.reclaim(r, false, "compensation") },
	}
}

// recordDirStep creates sandboxes/<id>/, where the derived record lives.
func (m *Manager) recordDirStep(id string) sagas.Step {
	dir := filepath.Dir(m.Root.Record(id))
	r := m.res(events.KindRecord, dir)
	return sagas.Step{
		Name: "record-dir",
		Do: func(context.Context) ([]events.Payload, error) {
			if err := fsx.Mkdir(string(m.Root), dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, err
			}
			return sagas.One(events.ResourceCreatedEvent{Resource: r}), nil
		},
		Undo: func(context.Context) ([]events.Payload, error) { return m.reclaim(r, false, "compensation") },
	}
}

// commitStep journals the sandbox as committed, owning every resource the
// saga has materialised so far.
func (m *Manager) commitStep(id string, committed func([]events.Resource) events.Payload) sagas.Step {
	return sagas.Step{
		Name:  "commit",
		Pivot: true,
		Do: func(ctx context.Context) ([]events.Payload, error) {
			sb, err := m.Find(ctx, id)
			if err != nil {
				return nil, err
			}
			var owned []events.Resource
			for _, r := range sb.Resources {
				if r.Kind != events.KindCreateIntent && r.Kind != events.KindShadowIntent {
					owned = append(owned, r)
				}
			}
			p := committed(owned)
			// A commit giving a handle claims it in the same append, on the
			// handle's subject: the journal takes one claim of two decided
			// on the same state.
			if h := events.HandleOf(events.Event{Payload: p}); h != "" {
				return []events.Payload{p, events.HandleClaimedEvent{Sandbox: id, Handle: h}}, nil
			}
			return sagas.One(p), nil
		},
		Undo: func(context.Context) ([]events.Payload, error) {
			return sagas.One(events.SandboxRemovedEvent{}), nil
		},
	}
}

// retireStep follows commit: only once the journal has acknowledged the
// commit are the leases released and the markers removed, so a reaper that
// sees a free lease also sees the commit.
func (m *Manager) retireStep(held []*intent.Held, intents []publishedIntent) sagas.Step {
	return sagas.Step{
		Name: "retire-intents",
		Do:   func(context.Context) ([]events.Payload, error) { return m.retireIntents(held, intents) },
	}
}

// treeBytes is the apparent size of every regular file under dir, the
// basis of a workspace image's size.
func treeBytes(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	return total, err
}

func roundMiB(n int64) int64 { return (n + (1<<20 - 1)) &^ (1<<20 - 1) }
