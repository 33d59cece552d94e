// Package powerfs is a FUSE filesystem for power-loss tests: it keeps what
// a disk's cache would lose at a power cut (file data not yet fsynced, and
// directory entries created, renamed or removed since the directory's own
// last fsync) in memory, and Cut drops it all.
//
// The backing directory holds only durable data: one object file per inode
// (objects/<ino>), written at the file's fsync. The durable namespace is
// each directory's entries as of its last fsync, kept by the FS value (so
// a cut is replayed by the process that mounted it); a file's data is
// durable at its own fsync, its name at its directory's. After Cut the
// mount shows what a machine would find after the cut: the entries
// reachable from the root through fsynced directories, each file with the
// data its last fsync made durable.
//
// It has no hard links, symbolic links or extended attributes, which a
// state root does not use. syncfs(2) does not reach a FUSE server (the
// kernel sends SYNCFS only to virtiofs), so a program relying on it would
// lose data here; Sync is the test's own syncfs.
package powerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

const pageSize = 64 << 10

// FS is one mounted powerfs.
type FS struct {
	backing string
	mnt     string

	mu      sync.Mutex
	gen     uint64 // bumped at each cut: a node of an older mount is dead
	nextIno uint64
	root    *node
	server  *fuse.Server
	syncs   int
}

// node is a file, directory or special file (socket, FIFO). Every field
// is guarded by FS.mu.
type node struct {
	fs.Inode
	pfs *FS
	gen uint64
	ino uint64

	mode  uint32 // type and permission bits as seen now
	dmode uint32 // permission bits made durable
	rdev  uint32
	uid   uint32
	gid   uint32
	mtime time.Time
	nlink int

	// Directories: the entries now, and as of the last fsync.
	cur, durable map[string]*node

	// Regular files: the object file holds the durable data, of dsize
	// bytes, of which [0, min(zeroFrom, dsize)) is still visible; pages
	// holds every page written since (whole pages, zero past size).
	obj      *os.File
	dsize    int64
	size     int64
	zeroFrom int64
	pages    map[int64][]byte
}

// Mount mounts a new, empty powerfs at mnt, keeping its durable data in
// backing (created if missing; it must be empty).
func Mount(backing, mnt string) (*FS, error) {
	if err := os.MkdirAll(filepath.Join(backing, "objects"), 0o700); err != nil {
		return nil, fmt.Errorf("powerfs: %w", err)
	}
	if entries, err := os.ReadDir(filepath.Join(backing, "objects")); err != nil || len(entries) > 0 {
		return nil, fmt.Errorf("powerfs: backing %s is not empty (%v)", backing, err)
	}
	f := &FS{backing: backing, mnt: mnt, nextIno: 2}
	f.root = f.newNode(fuse.S_IFDIR|0o755, 0)
	f.root.ino = 1
	f.root.durable = map[string]*node{}
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FS) newNode(mode, rdev uint32) *node {
	n := &node{pfs: f, gen: f.gen, mode: mode, dmode: mode &^ syscall.S_IFMT, rdev: rdev,
		uid: uint32(os.Getuid()), gid: uint32(os.Getgid()), mtime: time.Now()}
	n.ino = f.nextIno
	f.nextIno++
	if n.isDir() {
		n.cur = map[string]*node{}
	}
	return n
}

func (f *FS) mount() error {
	second := time.Second
	srv, err := fs.Mount(f.mnt, f.root, &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:      "powerfs",
			Name:        "powerfs",
			DirectMount: true,
			MaxWrite:    1 << 20,
		},
		EntryTimeout: &second,
		AttrTimeout:  &second,
	})
	if err != nil {
		return fmt.Errorf("powerfs: mount %s: %w", f.mnt, err)
	}
	f.server = srv
	return nil
}

// Dir is where the filesystem is mounted.
func (f *FS) Dir() string { return f.mnt }

// Syncs is how many fsyncs (of files and directories) the mount has served.
func (f *FS) Syncs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncs
}

// Unmount unmounts the filesystem, lazily if something still holds it.
func (f *FS) Unmount() error {
	f.mu.Lock()
	srv := f.server
	f.server = nil
	f.mu.Unlock()
	if srv == nil {
		return nil
	}
	if err := srv.Unmount(); err != nil {
		if derr := unix.Unmount(f.mnt, unix.MNT_DETACH); derr != nil {
			return fmt.Errorf("powerfs: unmount %s: %w (detach: %v)", f.mnt, err, derr)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closeObjects(f.root, map[*node]bool{})
	return nil
}

func (f *FS) closeObjects(n *node, seen map[*node]bool) {
	if seen[n] {
		return
	}
	seen[n] = true
	if n.obj != nil {
		n.obj.Close()
		n.obj = nil
	}
	for _, c := range n.cur {
		f.closeObjects(c, seen)
	}
	for _, c := range n.durable {
		f.closeObjects(c, seen)
	}
}

// Cut is a power cut and the reboot after it: it unmounts, drops every
// unsynced byte and directory change, and mounts what was durable at the
// same place. Stop every process using the mount first.
func (f *FS) Cut() error {
	if err := f.Unmount(); err != nil {
		return err
	}
	f.mu.Lock()
	f.gen++
	old := map[*node]*node{}
	f.root = f.rebuild(f.root, old)
	live := map[string]bool{}
	for o := range old {
		live[strconv.FormatUint(o.ino, 10)] = true
	}
	f.mu.Unlock()
	objects := filepath.Join(f.backing, "objects")
	entries, err := os.ReadDir(objects)
	if err != nil {
		return fmt.Errorf("powerfs: %w", err)
	}
	for _, e := range entries {
		if !live[e.Name()] {
			if err := os.Remove(filepath.Join(objects, e.Name())); err != nil {
				return fmt.Errorf("powerfs: %w", err)
			}
		}
	}
	return f.mount()
}

// rebuild is the durable image of n as a fresh node of the new mount.
func (f *FS) rebuild(n *node, done map[*node]*node) *node {
	if m, ok := done[n]; ok {
		m.nlink++
		return m
	}
	m := &node{pfs: f, gen: f.gen, ino: n.ino, mode: n.mode&syscall.S_IFMT | n.dmode, dmode: n.dmode,
		rdev: n.rdev, uid: n.uid, gid: n.gid, mtime: n.mtime, nlink: 1}
	done[n] = m
	switch n.mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		m.cur, m.durable = map[string]*node{}, map[string]*node{}
		for name, c := range n.durable {
			cm := f.rebuild(c, done)
			m.cur[name], m.durable[name] = cm, cm
		}
	case syscall.S_IFREG:
		if st, err := os.Stat(f.objectPath(n.ino)); err == nil {
			m.dsize = st.Size()
		}
		m.size, m.zeroFrom = m.dsize, m.dsize
	}
	return m
}

func (f *FS) objectPath(ino uint64) string {
	return filepath.Join(f.backing, "objects", strconv.FormatUint(ino, 10))
}

// Sync makes everything durable, as syncfs(2) would on a disk.
func (f *FS) Sync() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncTree(f.root, map[*node]bool{})
}

func (f *FS) syncTree(n *node, seen map[*node]bool) error {
	if seen[n] {
		return nil
	}
	seen[n] = true
	if err := n.fsyncLocked(); err != 0 {
		return fmt.Errorf("powerfs: sync inode %d: %w", n.ino, err)
	}
	for _, c := range n.cur {
		if err := f.syncTree(c, seen); err != nil {
			return err
		}
	}
	return nil
}

var (
	_ fs.NodeGetattrer = (*node)(nil)
	_ fs.NodeSetattrer = (*node)(nil)
	_ fs.NodeLookuper  = (*node)(nil)
	_ fs.NodeReaddirer = (*node)(nil)
	_ fs.NodeCreater   = (*node)(nil)
	_ fs.NodeMkdirer   = (*node)(nil)
	_ fs.NodeMknoder   = (*node)(nil)
	_ fs.NodeUnlinker  = (*node)(nil)
	_ fs.NodeRmdirer   = (*node)(nil)
	_ fs.NodeRenamer   = (*node)(nil)
	_ fs.NodeOpener    = (*node)(nil)
	_ fs.NodeReader    = (*node)(nil)
	_ fs.NodeWriter    = (*node)(nil)
	_ fs.NodeFsyncer   = (*node)(nil)
	_ fs.NodeStatfser  = (*node)(nil)
)

// lock takes the filesystem's lock; a node of a mount that was cut is
// dead and every operation on it fails.
func (n *node) lock() syscall.Errno {
	n.pfs.mu.Lock()
	if n.gen != n.pfs.gen {
		n.pfs.mu.Unlock()
		return syscall.EIO
	}
	return 0
}

func (n *node) unlock() { n.pfs.mu.Unlock() }

func (n *node) isDir() bool { return n.mode&syscall.S_IFMT == syscall.S_IFDIR }
func (n *node) isReg() bool { return n.mode&syscall.S_IFMT == syscall.S_IFREG }

func (n *node) fillAttr(a *fuse.Attr) {
	a.Ino = n.ino
	a.Mode = n.mode
	a.Rdev = n.rdev
	a.Owner = fuse.Owner{Uid: n.uid, Gid: n.gid}
	a.Nlink = uint32(max(n.nlink, 1))
	if n.isDir() {
		a.Nlink = 2
	}
	a.Size = uint64(n.size)
	a.Blocks = (a.Size + 511) / 512
	a.Blksize = 4096
	a.SetTimes(&n.mtime, &n.mtime, &n.mtime)
}

func (n *node) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	n.fillAttr(&out.Attr)
	return 0
}

func (n *node) Setattr(ctx context.Context, _ fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	if sz, ok := in.GetSize(); ok {
		if !n.isReg() {
			return syscall.EINVAL
		}
		n.truncate(int64(sz))
		n.mtime = time.Now()
	}
	if m, ok := in.GetMode(); ok {
		n.mode = n.mode&syscall.S_IFMT | m&07777
	}
	if uid, ok := in.GetUID(); ok {
		n.uid = uid
	}
	if gid, ok := in.GetGID(); ok {
		n.gid = gid
	}
	if mt, ok := in.GetMTime(); ok {
		n.mtime = mt
	}
	n.fillAttr(&out.Attr)
	return 0
}

func (n *node) child(ctx context.Context, c *node, out *fuse.EntryOut) *fs.Inode {
	c.fillAttr(&out.Attr)
	return n.NewPersistentInode(ctx, c, fs.StableAttr{Mode: c.mode & syscall.S_IFMT, Ino: c.ino})
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, e
	}
	defer n.unlock()
	c, ok := n.cur[name]
	if !ok {
		return nil, syscall.ENOENT
	}
	return n.child(ctx, c, out), 0
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, e
	}
	defer n.unlock()
	names := make([]string, 0, len(n.cur))
	for name := range n.cur {
		names = append(names, name)
	}
	sort.Strings(names)
	list := make([]fuse.DirEntry, 0, len(names))
	for _, name := range names {
		c := n.cur[name]
		list = append(list, fuse.DirEntry{Name: name, Mode: c.mode, Ino: c.ino})
	}
	return fs.NewListDirStream(list), 0
}

// add links c at name in n, the way a create does: in memory only.
func (n *node) add(name string, c *node) {
	n.cur[name] = c
	c.nlink++
	n.mtime = time.Now()
}

func (n *node) remove(name string) {
	if c, ok := n.cur[name]; ok {
		c.nlink--
		delete(n.cur, name)
		n.mtime = time.Now()
	}
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, nil, 0, e
	}
	defer n.unlock()
	if c, ok := n.cur[name]; ok {
		if flags&syscall.O_EXCL != 0 {
			return nil, nil, 0, syscall.EEXIST
		}
		if c.isDir() {
			return nil, nil, 0, syscall.EISDIR
		}
		if flags&syscall.O_TRUNC != 0 && c.isReg() {
			c.truncate(0)
		}
		return n.child(ctx, c, out), nil, 0, 0
	}
	c := n.pfs.newNode(syscall.S_IFREG|mode&07777, 0)
	c.owner(ctx)
	n.add(name, c)
	return n.child(ctx, c, out), nil, 0, 0
}

func (c *node) owner(ctx context.Context) {
	if caller, ok := fuse.FromContext(ctx); ok {
		c.uid, c.gid = caller.Uid, caller.Gid
	}
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, e
	}
	defer n.unlock()
	if _, ok := n.cur[name]; ok {
		return nil, syscall.EEXIST
	}
	c := n.pfs.newNode(syscall.S_IFDIR|mode&07777, 0)
	c.durable = map[string]*node{}
	c.owner(ctx)
	n.add(name, c)
	return n.child(ctx, c, out), 0
}

func (n *node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, e
	}
	defer n.unlock()
	if _, ok := n.cur[name]; ok {
		return nil, syscall.EEXIST
	}
	switch mode & syscall.S_IFMT {
	case syscall.S_IFSOCK, syscall.S_IFIFO, syscall.S_IFREG:
	default:
		return nil, syscall.EPERM
	}
	c := n.pfs.newNode(mode, dev)
	c.owner(ctx)
	n.add(name, c)
	return n.child(ctx, c, out), 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	c, ok := n.cur[name]
	if !ok {
		return syscall.ENOENT
	}
	if c.isDir() {
		return syscall.EISDIR
	}
	n.remove(name)
	return 0
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	c, ok := n.cur[name]
	if !ok {
		return syscall.ENOENT
	}
	if !c.isDir() {
		return syscall.ENOTDIR
	}
	if len(c.cur) > 0 {
		return syscall.ENOTEMPTY
	}
	n.remove(name)
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	np, ok := newParent.(*node)
	if !ok || np.gen != n.gen {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL
	}
	c, ok := n.cur[name]
	if !ok {
		return syscall.ENOENT
	}
	if old, ok := np.cur[newName]; ok {
		if old == c {
			return 0
		}
		if flags&unix.RENAME_NOREPLACE != 0 {
			return syscall.EEXIST
		}
		switch {
		case old.isDir() && !c.isDir():
			return syscall.EISDIR
		case !old.isDir() && c.isDir():
			return syscall.ENOTDIR
		case old.isDir() && len(old.cur) > 0:
			return syscall.ENOTEMPTY
		}
		np.remove(newName)
	}
	n.remove(name)
	np.add(newName, c)
	return 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, 0, e
	}
	defer n.unlock()
	if flags&syscall.O_TRUNC != 0 && n.isReg() {
		n.truncate(0)
	}
	return nil, 0, 0
}

func (n *node) Read(ctx context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return nil, e
	}
	defer n.unlock()
	if !n.isReg() {
		return nil, syscall.EINVAL
	}
	if off >= n.size {
		return fuse.ReadResultData(nil), 0
	}
	buf := dest[:min(int64(len(dest)), n.size-off)]
	for done := 0; done < len(buf); {
		pos := off + int64(done)
		idx, in := pos/pageSize, pos%pageSize
		piece := buf[done:min(len(buf), done+int(pageSize-in))]
		if p, ok := n.pages[idx]; ok {
			copy(piece, p[in:])
		} else if err := n.readDurable(piece, pos); err != nil {
			return nil, syscall.EIO
		}
		done += len(piece)
	}
	return fuse.ReadResultData(buf), 0
}

// readDurable fills b with the durable data visible at off: zeros past it.
func (n *node) readDurable(b []byte, off int64) error {
	clear(b)
	end := min(n.zeroFrom, n.dsize)
	if off >= end {
		return nil
	}
	if err := n.openObject(false); err != nil {
		return err
	}
	want := b[:min(int64(len(b)), end-off)]
	_, err := n.obj.ReadAt(want, off)
	return err
}

func (n *node) openObject(create bool) error {
	if n.obj != nil {
		return nil
	}
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	obj, err := os.OpenFile(n.pfs.objectPath(n.ino), flags, 0o600)
	if err != nil {
		return err
	}
	n.obj = obj
	return nil
}

func (n *node) Write(ctx context.Context, _ fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if e := n.lock(); e != 0 {
		return 0, e
	}
	defer n.unlock()
	if !n.isReg() {
		return 0, syscall.EINVAL
	}
	if n.pages == nil {
		n.pages = map[int64][]byte{}
	}
	for done := 0; done < len(data); {
		pos := off + int64(done)
		idx, in := pos/pageSize, pos%pageSize
		p, ok := n.pages[idx]
		if !ok {
			p = make([]byte, pageSize)
			if err := n.readDurable(p, idx*pageSize); err != nil {
				return 0, syscall.EIO
			}
			n.pages[idx] = p
		}
		done += copy(p[in:], data[done:])
	}
	n.size = max(n.size, off+int64(len(data)))
	n.mtime = time.Now()
	return uint32(len(data)), 0
}

func (n *node) truncate(size int64) {
	if size < n.size {
		for idx, p := range n.pages {
			switch start := idx * pageSize; {
			case start >= size:
				delete(n.pages, idx)
			case start+pageSize > size:
				clear(p[size-start:])
			}
		}
		n.zeroFrom = min(n.zeroFrom, size)
	}
	n.size = size
}

func (n *node) Fsync(ctx context.Context, _ fs.FileHandle, flags uint32) syscall.Errno {
	if e := n.lock(); e != 0 {
		return e
	}
	defer n.unlock()
	return n.fsyncLocked()
}

// fsyncLocked makes a file's data, or a directory's entries, durable.
func (n *node) fsyncLocked() syscall.Errno {
	n.pfs.syncs++
	n.dmode = n.mode &^ syscall.S_IFMT
	switch {
	case n.isDir():
		n.durable = make(map[string]*node, len(n.cur))
		for name, c := range n.cur {
			n.durable[name] = c
		}
	case n.isReg():
		if err := n.writeObject(); err != nil {
			return errnoOf(err)
		}
	}
	return 0
}

func (n *node) writeObject() error {
	if err := n.openObject(true); err != nil {
		return err
	}
	if n.zeroFrom < n.dsize {
		if err := n.obj.Truncate(n.zeroFrom); err != nil {
			return err
		}
	}
	for idx, p := range n.pages {
		start := idx * pageSize
		if start >= n.size {
			continue
		}
		if _, err := n.obj.WriteAt(p[:min(pageSize, n.size-start)], start); err != nil {
			return err
		}
	}
	if err := n.obj.Truncate(n.size); err != nil {
		return err
	}
	if err := n.obj.Sync(); err != nil {
		return err
	}
	n.dsize, n.zeroFrom, n.pages = n.size, n.size, nil
	return nil
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st syscall.Statfs_t
	if err := syscall.Statfs(n.pfs.backing, &st); err != nil {
		return errnoOf(err)
	}
	out.FromStatfsT(&st)
	return 0
}
