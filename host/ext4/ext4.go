// Package ext4 runs the real e2fsprogs tools (e2fsck, dumpe2fs, resize2fs,
// mkfs.ext4, debugfs) against ext4 image files and turns their output into
// typed figures and typed refusals. It never edits an image it was asked
// only to check: Check opens the image read-only (e2fsck -n).
package ext4

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/nexus-sandbox/nexus/oneline"
)

var (
	// ErrNotExt4: the image has no valid ext4 superblock.
	ErrNotExt4 = errors.New("not ext4")
	// ErrInteractiveRepair: preen stopped because the repair needs a human
	// (an unattached inode to reconnect into lost+found, or any other
	// "UNEXPECTED INCONSISTENCY").
	ErrInteractiveRepair = errors.New("repair needs interactive fsck")
	// ErrToolMissing: an e2fsprogs tool is absent or does not run.
	ErrToolMissing = errors.New("host tool missing")
)

// Tools are the e2fsprogs programs nexus needs, each with a probe the
// program really supports. resize2fs has no -V: run bare it prints its
// version and usage and exits 1, which is the probe.
var Tools = []struct {
	Name  string
	Probe []string
}{
	{"e2fsck", []string{"-V"}},
	{"resize2fs", nil},
	{"mkfs.ext4", []string{"-V"}},
	{"debugfs", []string{"-V"}},
	{"dumpe2fs", []string{"-V"}},
}

// PathEnv names directories (colon-separated) that, when set, are the only
// place the tools are looked for: for e2fsprogs installed outside PATH,
// and for testing what a host without them does.
const PathEnv = "NEXUS_E2FSPROGS_PATH"

// Lookup finds a tool in $NEXUS_E2FSPROGS_PATH when set, else on PATH or
// in the sbin directories a daemon's PATH may lack.
func Lookup(name string) (string, error) {
	dirs := []string{"/usr/sbin", "/sbin"}
	if only := os.Getenv(PathEnv); only != "" {
		dirs = strings.Split(only, ":")
	} else if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range dirs {
		p := dir + "/" + name
		if info, err := os.Stat(p); err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s not found in %s (install e2fsprogs)", ErrToolMissing, name, strings.Join(dirs, ":"))
}

// Preflight checks every tool is present and answers its probe with an
// e2fsprogs version banner. It returns the banner of each, by name.
func Preflight(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	for _, t := range Tools {
		path, err := Lookup(t.Name)
		if err != nil {
			return out, err
		}
		cmd := exec.CommandContext(ctx, path, t.Probe...)
		cmd.Env = toolEnv()
		text, _ := cmd.CombinedOutput() // resize2fs's probe exits 1 by design
		banner := versionRE().FindString(string(text))
		if banner == "" && ctx.Err() != nil {
			// The probe was killed by the interruption, not found wanting.
			return out, fmt.Errorf("%s %s: %w", path, strings.Join(t.Probe, " "), context.Cause(ctx))
		}
		if banner == "" {
			return out, fmt.Errorf("%w: %s %s did not print an e2fsprogs version: %s", ErrToolMissing, path, strings.Join(t.Probe, " "), oneline.Of(string(text)))
		}
		out[t.Name] = banner
	}
	return out, nil
}

var versionRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`\b(e2fsck|resize2fs|mke2fs|debugfs|dumpe2fs) \d+\.\d+(\.\d+)?`)
})

// toolEnv fixes the locale (the output is parsed) and keeps a site
// e2fsck.conf from changing what preen may fix on its own.
func toolEnv() []string {
	return append(os.Environ(), "LC_ALL=C", "LANG=C", "E2FSCK_CONFIG=/dev/null")
}

// Check is what a read-only check found. Block figures are in file-system
// blocks of BlockSize bytes.
type Check struct {
	BlockSize      int64 `json:"block_size"`
	Blocks         int64 `json:"blocks"`
	UsedBlocks     int64 `json:"used_blocks"` // counted by e2fsck, not the superblock's claim
	ReservedBlocks int64 `json:"reserved_blocks"`
	ClaimedFree    int64 `json:"claimed_free_blocks"` // the superblock's free count, for reports only
	Inodes         int64 `json:"inodes"`
	UsedInodes     int64 `json:"used_inodes"`
	NeedsRecovery  bool  `json:"needs_recovery"` // the journal holds transactions not yet replayed
	// StaleCounts: the superblock's free block or inode count differs from
	// what e2fsck counted ("Free blocks count wrong (X, counted=Y)"), as a
	// guest that only synced leaves it. The figures above are the counted
	// ones; the image is not Clean, and only a preen fixes the superblock.
	StaleCounts bool `json:"stale_counts,omitempty"`
	// Clean is e2fsck -fn finding nothing to fix: exit 0 and no stale count
	// (e2fsck -n declines that fix and still exits 0).
	Clean bool `json:"clean"`
	// Problems are e2fsck's complaints, when not Clean.
	Problems []string `json:"problems,omitempty"`
}

// Bytes is the file system's size.
func (c Check) Bytes() int64 { return c.Blocks * c.BlockSize }

// UsableBytes is what an unprivileged guest writer can still allocate:
// checked free blocks minus reserved blocks.
func (c Check) UsableBytes() int64 {
	return max(0, c.Blocks-c.UsedBlocks-c.ReservedBlocks) * c.BlockSize
}

// FillRatio is used / (total - reserved): 1.0 is the point where a guest
// writer gets ENOSPC.
func (c Check) FillRatio() float64 {
	avail := c.Blocks - c.ReservedBlocks
	if avail <= 0 {
		return 1
	}
	return float64(c.UsedBlocks) / float64(avail)
}

// CheckImage runs dumpe2fs -h and e2fsck -fn on the image at path. Neither
// writes to it. A damaged superblock is ErrNotExt4; any other finding is
// reported in the Check (Clean false, Problems), not as an error.
func CheckImage(ctx context.Context, path string) (Check, error) {
	var c Check
	head, err := run(ctx, "dumpe2fs", "-h", path)
	if err != nil {
		if badSuper(head) {
			return c, fmt.Errorf("%s: %w: %s", path, ErrNotExt4, firstMatch(head, badSuperRE()))
		}
		return c, fmt.Errorf("dumpe2fs %s: %v: %s", path, err, oneline.Of(head))
	}
	fields := superblockFields(head)
	for name, dst := range map[string]*int64{
		"Block size": &c.BlockSize, "Block count": &c.Blocks, "Reserved block count": &c.ReservedBlocks,
		"Free blocks": &c.ClaimedFree, "Inode count": &c.Inodes,
	} {
		v, err := strconv.ParseInt(fields[name], 10, 64)
		if err != nil {
			return c, fmt.Errorf("dumpe2fs %s: field %q: %q", path, name, fields[name])
		}
		*dst = v
	}
	c.NeedsRecovery = strings.Contains(" "+fields["Filesystem features"]+" ", " needs_recovery ")

	text, err := run(ctx, "e2fsck", "-f", "-n", path)
	code := exitCode(err)
	if code < 0 || code >= 8 {
		if badSuper(text) {
			return c, fmt.Errorf("%s: %w: %s", path, ErrNotExt4, firstMatch(text, badSuperRE()))
		}
		return c, fmt.Errorf("e2fsck -fn %s: exit %d: %s", path, code, oneline.Of(text))
	}
	m := summaryRE().FindStringSubmatch(text)
	if m == nil {
		return c, fmt.Errorf("e2fsck -fn %s: no summary line in: %s", path, oneline.Of(text))
	}
	if total, _ := strconv.ParseInt(m[4], 10, 64); total != c.Blocks {
		return c, fmt.Errorf("e2fsck -fn %s: counted %d blocks, superblock says %d", path, total, c.Blocks)
	}
	// The summary line prints the superblock's free counts, which -n never
	// corrects: when pass 5 reports a total count wrong, its "counted"
	// figure is the truth. Without such a line the superblock's total
	// agreed with the count and the summary is the counted figure.
	c.UsedInodes, _ = strconv.ParseInt(m[1], 10, 64)
	c.UsedBlocks, _ = strconv.ParseInt(m[3], 10, 64)
	if w := freeBlocksWrongRE().FindStringSubmatch(text); w != nil {
		counted, _ := strconv.ParseInt(w[2], 10, 64)
		c.UsedBlocks, c.StaleCounts = c.Blocks-counted, true
	}
	if w := freeInodesWrongRE().FindStringSubmatch(text); w != nil {
		counted, _ := strconv.ParseInt(w[2], 10, 64)
		c.UsedInodes, c.StaleCounts = c.Inodes-counted, true
	}
	if c.UsedBlocks < 0 || c.UsedBlocks > c.Blocks || c.UsedInodes < 0 || c.UsedInodes > c.Inodes {
		return c, fmt.Errorf("e2fsck -fn %s: counted figures out of range (%d/%d blocks, %d/%d inodes used)", path, c.UsedBlocks, c.Blocks, c.UsedInodes, c.Inodes)
	}
	c.Clean = code == 0 && !c.StaleCounts && !countWrongRE().MatchString(text)
	if !c.Clean {
		c.Problems = problems(text)
	}
	return c, nil
}

// Preen runs e2fsck -f -p on path, which must be a private copy: it
// replays the journal and makes the repairs e2fsck considers safe without a
// human. A repair that needs one, or one that would reconnect an inode into
// lost+found, is ErrInteractiveRepair; the copy is then useless and the
// caller discards it.
func Preen(ctx context.Context, path string) (string, error) {
	text, err := run(ctx, "e2fsck", "-f", "-p", path)
	code := exitCode(err)
	switch {
	case code >= 0 && code&4 != 0:
		return text, fmt.Errorf("%w: %s", ErrInteractiveRepair, oneline.Of(problemText(text)))
	case code < 0 || code >= 8:
		if badSuper(text) {
			return text, fmt.Errorf("%s: %w", path, ErrNotExt4)
		}
		return text, fmt.Errorf("e2fsck -fp %s: exit %d: %s", path, code, oneline.Of(text))
	}
	if strings.Contains(text, "lost+found") {
		return text, fmt.Errorf("%w: preen reconnected an inode into lost+found: %s", ErrInteractiveRepair, oneline.Of(text))
	}
	return text, nil
}

// Grow extends the image file at path to newBytes (sparsely) and grows its
// file system to fill it with resize2fs. The file system must have been
// checked (e2fsck -f) since it was last mounted.
func Grow(ctx context.Context, path string, newBytes int64) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if newBytes <= info.Size() {
		return fmt.Errorf("grow %s: %d bytes is not larger than %d", path, newBytes, info.Size())
	}
	if err := os.Truncate(path, newBytes); err != nil {
		return fmt.Errorf("grow %s: %w", path, err)
	}
	if text, err := run(ctx, "resize2fs", path); err != nil {
		return fmt.Errorf("resize2fs %s: %v: %s", path, err, oneline.Of(text))
	}
	return nil
}

// ReadFile returns the contents of file inside the image (debugfs cat),
// without mounting it.
func ReadFile(ctx context.Context, image, file string) ([]byte, error) {
	path, err := Lookup("debugfs")
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "-R", "cat "+quote(file), image)
	cmd.Env = toolEnv()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("debugfs cat %s in %s: %v: %s", file, image, err, oneline.Of(stderr.String()))
	}
	// debugfs reports a missing file on stderr and still exits 0.
	if s := stderr.String(); strings.Contains(s, "File not found") || strings.Contains(s, "not found by ext2_lookup") {
		return nil, fmt.Errorf("debugfs cat %s in %s: %w", file, image, os.ErrNotExist)
	}
	return stdout.Bytes(), nil
}

// FileSize returns the size debugfs reports for file inside the image.
func FileSize(ctx context.Context, image, file string) (int64, error) {
	text, err := run(ctx, "debugfs", "-R", "stat "+quote(file), image)
	if err != nil {
		return 0, fmt.Errorf("debugfs stat %s: %v: %s", file, err, oneline.Of(text))
	}
	m := sizeRE().FindStringSubmatch(text)
	if m == nil {
		return 0, fmt.Errorf("debugfs stat %s in %s: %w", file, image, os.ErrNotExist)
	}
	return strconv.ParseInt(m[1], 10, 64)
}

var (
	summaryRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(\d+)/(\d+) files .*?, (\d+)/(\d+) blocks`) })
	// pass 5's whole-file-system totals; the per-group lines read
	// "... count wrong for group #N (X, counted=Y)".
	freeBlocksWrongRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?m)^Free blocks count wrong \((\d+), counted=(\d+)\)`)
	})
	freeInodesWrongRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?m)^Free inodes count wrong \((\d+), counted=(\d+)\)`)
	})
	// any count pass 5 found wrong, group ones and directory counts included
	countWrongRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?m)count wrong`) })
	badSuperRE   = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)bad magic number in super-block|superblock is corrupt|couldn't find valid filesystem superblock`)
	})
	sizeRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?m)\bSize: (\d+)`) })
)

func badSuper(text string) bool { return badSuperRE().MatchString(text) }

func firstMatch(text string, re *regexp.Regexp) string {
	if m := re.FindString(text); m != "" {
		return m
	}
	return oneline.Of(text)
}

func superblockFields(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		k = strings.TrimSpace(k)
		if _, seen := out[k]; ok && !seen {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// problems keeps e2fsck's findings and drops its pass banners.
func problems(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "", strings.HasPrefix(l, "Pass "), strings.HasPrefix(l, "e2fsck "), summaryRE().MatchString(l),
			strings.Contains(l, "WARNING: Filesystem still has errors"):
			continue
		}
		out = append(out, l)
	}
	return out
}

func problemText(text string) string { return strings.Join(problems(text), "; ") }

func run(ctx context.Context, tool string, args ...string) (string, error) {
	path, err := Lookup(tool)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = toolEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// exitCode is the tool's exit status, or -1 when it did not run or died by
// a signal.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// quote makes a path one debugfs argument.
func quote(p string) string { return `"` + strings.ReplaceAll(p, `"`, `\"`) + `"` }
