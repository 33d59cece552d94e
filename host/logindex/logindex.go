// Package logindex is the time index of a log that carries no times of
// its own (a sandbox's serial console, which the VMM writes): a watcher
// appends the log's size and the wall time whenever it saw the log grow,
// and a reader places each line of the log in time and finds where the
// lines since a time begin.
//
// A line's time is when the watcher first saw it whole: accurate to the
// watcher's period (about a second), never earlier than the line was
// written. The index is advisory: it is never fsynced, and a torn last
// record is ignored.
package logindex

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"time"
)

// RecordSize is the length of one record, a text line of two 19-digit
// zero-padded decimals: "<unix nanoseconds> <log size in bytes>\n".
const RecordSize = 40

// Record says that at Time the log held Offset bytes.
type Record struct {
	Time   time.Time
	Offset int64
}

func (r Record) encode() []byte {
	return fmt.Appendf(nil, "%019d %019d\n", r.Time.UnixNano(), r.Offset)
}

// ErrCorrupt means a record of the index does not read as one.
var ErrCorrupt = errors.New("unreadable record")

func decode(b []byte) (Record, error) {
	if len(b) != RecordSize || b[19] != ' ' || b[RecordSize-1] != '\n' {
		return Record{}, ErrCorrupt
	}
	ns, err1 := strconv.ParseInt(string(b[:19]), 10, 64)
	off, err2 := strconv.ParseInt(string(b[20:RecordSize-1]), 10, 64)
	if err1 != nil || err2 != nil || off < 0 {
		return Record{}, ErrCorrupt
	}
	return Record{Time: time.Unix(0, ns), Offset: off}, nil
}

// Reader reads an index alongside its log, whose lines are asked about
// in order.
type Reader struct {
	f    *os.File
	name string
	// buf holds the records from record number base on; next is the
	// first of them not yet passed.
	buf  []Record
	base int64
	next int
	// last is the newest record passed (every offset it and those
	// before it hold is below a line asked about).
	last Record
}

// NewReader reads the index f. A nil f is an empty index (the log has
// none yet).
func NewReader(f *os.File) *Reader {
	r := &Reader{f: f}
	if f != nil {
		r.name = f.Name()
	}
	return r
}

// count is the number of whole records in the index now.
func (r *Reader) count() (int64, error) {
	if r.f == nil {
		return 0, nil
	}
	fi, err := r.f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size() / RecordSize, nil
}

// at reads record i.
func (r *Reader) at(i int64) (Record, error) {
	b := make([]byte, RecordSize)
	if _, err := r.f.ReadAt(b, i*RecordSize); err != nil {
		return Record{}, fmt.Errorf("index %s: record %d: %w", r.name, i, err)
	}
	rec, err := decode(b)
	if err != nil {
		return Record{}, fmt.Errorf("index %s: record %d: %w", r.name, i, err)
	}
	return rec, nil
}

// search is the first record number in [0, n) for which ok holds (n if
// none), ok being false then true along the index.
func (r *Reader) search(n int64, ok func(Record) bool) (int64, error) {
	var err error
	i := sort.Search(int(n), func(i int) bool {
		if err != nil {
			return true
		}
		rec, e := r.at(int64(i))
		if e != nil {
			err = e
			return true
		}
		return ok(rec)
	})
	return int64(i), err
}

// moveToRecord makes record i the next one, every record before it passed.
func (r *Reader) moveToRecord(i int64) error {
	r.buf, r.base, r.next, r.last = nil, i, 0, Record{}
	if i > 0 {
		rec, err := r.at(i - 1)
		if err != nil {
			return err
		}
		r.last = rec
	}
	return nil
}

// From moves the reader to the first record past offset: the lines from
// offset on are asked about next.
func (r *Reader) From(offset int64) error {
	n, err := r.count()
	if err != nil {
		return err
	}
	i, err := r.search(n, func(rec Record) bool { return rec.Offset > offset })
	if err != nil {
		return err
	}
	return r.moveToRecord(i)
}

// Since is where the log's lines at or after t (by Stamp) begin: the
// size the log had when the watcher last saw it before t. The line in
// progress there began earlier; the caller prints it whole. modTime is
// the log's modification time. fromEnd says no line is that recent: the
// lines since t are those still to come.
func (r *Reader) Since(t, modTime time.Time) (offset int64, fromEnd bool, err error) {
	n, err := r.count()
	if err != nil {
		return 0, false, err
	}
	i, err := r.search(n, func(rec Record) bool { return !rec.Time.Before(t) })
	if err != nil {
		return 0, false, err
	}
	var before Record
	if i > 0 {
		if before, err = r.at(i - 1); err != nil {
			return 0, false, err
		}
	}
	// What lies past the last record is stamped with modTime.
	if i == n && modTime.Before(t) {
		return 0, true, nil
	}
	return before.Offset, false, nil
}

// Stamp is the time of the line of the log that ends at end (past its
// newline): the first record that holds it, read on as the index grows;
// a line no record holds yet gets modTime, the log's modification time
// read after the line was, and never a time before the newest record.
// Lines are asked about in order.
func (r *Reader) Stamp(end int64, modTime time.Time) (time.Time, error) {
	for {
		for ; r.next < len(r.buf); r.next++ {
			if rec := r.buf[r.next]; rec.Offset >= end {
				return rec.Time, nil
			}
			r.last = r.buf[r.next]
		}
		more, err := r.load()
		if err != nil {
			return time.Time{}, err
		}
		if !more {
			if modTime.Before(r.last.Time) {
				return r.last.Time, nil
			}
			return modTime, nil
		}
	}
}

// loadRecords is how many records load reads at a time.
const loadRecords = 256

// load reads the records after buf; more is false when there are none yet.
func (r *Reader) load() (more bool, err error) {
	if r.f == nil {
		return false, nil
	}
	from := r.base + int64(len(r.buf))
	b := make([]byte, loadRecords*RecordSize)
	n, err := r.f.ReadAt(b, from*RecordSize)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("index %s: %w", r.name, err)
	}
	b = b[:n-n%RecordSize]
	if len(b) == 0 {
		return false, nil
	}
	recs := make([]Record, 0, len(b)/RecordSize)
	for i := 0; i < len(b); i += RecordSize {
		rec, err := decode(b[i : i+RecordSize])
		if err != nil {
			return false, fmt.Errorf("index %s: record %d: %w", r.name, from+int64(i/RecordSize), err)
		}
		recs = append(recs, rec)
	}
	r.buf, r.base, r.next = recs, from, 0
	return true, nil
}

// Close closes the index.
func (r *Reader) Close() error {
	if r.f == nil {
		return nil
	}
	return r.f.Close()
}
