package disk

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// CopyScratch copies src's data extents (SEEK_DATA/SEEK_HOLE) into a new
// file dst (O_EXCL 0600), so holes stay holes. Unlike Clone it neither
// starts writeback nor fsyncs: it is for private scratch copies (the
// overlay recovery's) that tools rewrite next and that the caller fsyncs
// once it has finished with them, so the data is written back once, at the
// end, as `cp` followed by a tool's own fsync would. dst is removed if the
// copy fails. progress (nil: none) hears its position after each chunk.
func CopyScratch(src, dst string, progress Progress) (err error) {
	if progress == nil {
		progress = func(int64, int64) {}
	}
	in, size, err := openSource(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("disk: copy %s: create %s: %w", src, dst, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if err := out.Truncate(size); err != nil {
		return fmt.Errorf("disk: copy %s: %w", src, err)
	}
	_ = unix.Fadvise(int(in.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
	buf := make([]byte, copyChunk)
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains, and dst already is one
		}
		if err != nil {
			return fmt.Errorf("disk: copy %s: seek data at %d: %w", src, off, err)
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("disk: copy %s: seek hole at %d: %w", src, data, err)
		}
		hole = min(hole, size)
		for pos := data; pos < hole; {
			n := int(min(int64(len(buf)), hole-pos))
			if _, err := in.ReadAt(buf[:n], pos); err != nil {
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("disk: copy %s: source shrank below %d bytes during copy", src, size)
				}
				return fmt.Errorf("disk: copy %s: %w", src, err)
			}
			if _, err := out.WriteAt(buf[:n], pos); err != nil {
				return fmt.Errorf("disk: copy %s to %s: %w", src, dst, err)
			}
			pos += int64(n)
			progress(pos, size)
		}
		off = hole
	}
	progress(size, size)
	return nil
}
