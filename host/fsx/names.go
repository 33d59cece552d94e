package fsx

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NamesMatching lists the names in directory dir beneath root that match
// accepts, reading the directory's entries in large batches straight from
// getdents64: a name match refuses costs no allocation and no stat, so a
// directory of many entries and few wanted ones costs its read alone.
// match must not keep the string it is given (it aliases the read buffer).
func NamesMatching(root, dir string, match func(name string) bool) ([]string, error) {
	d, err := OpenDir(root, dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	fd := int(d.Fd())
	buf := make([]byte, 64<<10)
	var out []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8,
		// then the NUL-terminated name.
		for off := 0; off+19 <= n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			if reclen == 0 || off+reclen > n {
				break
			}
			name := buf[off+19 : off+reclen]
			for i, c := range name {
				if c == 0 {
					name = name[:i]
					break
				}
			}
			off += reclen
			if len(name) == 0 || (len(name) <= 2 && name[0] == '.' && (len(name) == 1 || name[1] == '.')) {
				continue
			}
			if match(unsafe.String(&name[0], len(name))) {
				out = append(out, string(name))
			}
		}
	}
}
