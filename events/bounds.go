package events

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// maxDepth bounds how deeply msgpack values may nest. nexus's own records
// nest four levels; anything far deeper is damage, and walking it would
// only cost stack.
const maxDepth = 32

var errTruncated = errors.New("msgpack value runs past the end of its bytes")

// checkBounds walks the one msgpack value in b without decoding it and
// verifies that everything it declares is present: every string, binary
// and extension fits in b, and no array or map declares more elements than
// b has bytes left (each element takes at least one). It also requires the
// value to end exactly at the end of b.
//
// It exists because msgpack v5.4 allocates a declared slice length up
// front, whatever its alloc-limit setting, so five damaged bytes announcing
// 0xdddddddd elements would ask for gigabytes. After this walk no declared
// length exceeds len(b). It reads b in place; the library's Skip would do
// the same job but copies every string it passes, a quarter of decode time.
func checkBounds(b []byte) error {
	end, err := walk(b, 0, 0)
	if err != nil {
		return err
	}
	if end != len(b) {
		return errors.New("trailing bytes")
	}
	return nil
}

// walk returns the offset just past the value starting at off.
func walk(b []byte, off, depth int) (int, error) {
	if depth > maxDepth {
		return 0, fmt.Errorf("msgpack values nested deeper than %d", maxDepth)
	}
	if off >= len(b) {
		return 0, errTruncated
	}
	c := b[off]
	off++
	switch {
	case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixints, nil, bools
		return off, nil
	case c >= 0x80 && c <= 0x8f:
		return walkItems(b, off, 2*int(c&0x0f), depth)
	case c >= 0x90 && c <= 0x9f:
		return walkItems(b, off, int(c&0x0f), depth)
	case c >= 0xa0 && c <= 0xbf:
		return span(b, off, int(c&0x1f))
	}
	switch c {
	case 0xcc, 0xd0: // uint8, int8
		return span(b, off, 1)
	case 0xcd, 0xd1: // uint16, int16
		return span(b, off, 2)
	case 0xca, 0xce, 0xd2: // float32, uint32, int32
		return span(b, off, 4)
	case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
		return span(b, off, 8)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16 (+ type byte)
		return span(b, off, 1+1<<(c-0xd4))
	case 0xc4, 0xd9: // bin8, str8
		n, off, err := length(b, off, 1)
		if err != nil {
			return 0, err
		}
		return span(b, off, n)
	case 0xc5, 0xda: // bin16, str16
		n, off, err := length(b, off, 2)
		if err != nil {
			return 0, err
		}
		return span(b, off, n)
	case 0xc6, 0xdb: // bin32, str32
		n, off, err := length(b, off, 4)
		if err != nil {
			return 0, err
		}
		return span(b, off, n)
	case 0xc7, 0xc8, 0xc9: // ext8, ext16, ext32 (+ type byte)
		n, off, err := length(b, off, 1<<(c-0xc7))
		if err != nil {
			return 0, err
		}
		return span(b, off, n+1)
	case 0xdc, 0xde: // array16, map16
		n, off, err := length(b, off, 2)
		if err != nil {
			return 0, err
		}
		if c == 0xde {
			n *= 2
		}
		return walkItems(b, off, n, depth)
	case 0xdd, 0xdf: // array32, map32
		n, off, err := length(b, off, 4)
		if err != nil {
			return 0, err
		}
		if c == 0xdf {
			n *= 2
		}
		return walkItems(b, off, n, depth)
	}
	return 0, fmt.Errorf("msgpack code 0x%02x is not valid", c)
}

// walkItems walks n consecutive values, refusing a count that the bytes
// left could not hold.
func walkItems(b []byte, off, n, depth int) (int, error) {
	if n > len(b)-off {
		return 0, fmt.Errorf("msgpack container declares %d items with %d bytes left", n, len(b)-off)
	}
	var err error
	for range n {
		if off, err = walk(b, off, depth+1); err != nil {
			return 0, err
		}
	}
	return off, nil
}

// length reads a big-endian length of size bytes at off.
func length(b []byte, off, size int) (int, int, error) {
	if len(b)-off < size {
		return 0, 0, errTruncated
	}
	var n uint64
	switch size {
	case 1:
		n = uint64(b[off])
	case 2:
		n = uint64(binary.BigEndian.Uint16(b[off:]))
	case 4:
		n = uint64(binary.BigEndian.Uint32(b[off:]))
	}
	if n > uint64(len(b)) {
		return 0, 0, errTruncated
	}
	return int(n), off + size, nil
}

// span skips n bytes of data at off.
func span(b []byte, off, n int) (int, error) {
	if n > len(b)-off {
		return 0, errTruncated
	}
	return off + n, nil
}
