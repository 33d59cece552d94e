package agentproto

import (
	"bytes"
	"errors"
	"io"
	"net"
	"reflect"
	"runtime"
	"testing"
)

// TestDataFrameCopiesOnce: a full data frame written and read back costs
// about one payload of fresh memory (the decoded Data the reader keeps),
// not the several a growing encode buffer and a per-frame read buffer
// cost: those were most of a cp's CPU, and a cp moves a hundred of them
// per 100 MiB.
func TestDataFrameCopiesOnce(t *testing.T) {
	payload := bytes.Repeat([]byte{7}, MaxData)
	m := &Message{Type: TData, ID: 2, Ref: 1, Data: payload}
	var wire bytes.Buffer
	w, r := NewFrameWriter(&wire), NewFrameReader(&wire)
	roundTrip := func() {
		wire.Reset()
		if err := w.Write(m); err != nil {
			t.Fatal(err)
		}
		got, err := r.Read()
		if err != nil || len(got.Data) != MaxData {
			t.Fatalf("read back %v", err)
		}
	}
	for i := 0; i < 3; i++ {
		roundTrip() // the buffers grown
	}
	const rounds = 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < rounds; i++ {
		roundTrip()
	}
	runtime.ReadMemStats(&after)
	perFrame := float64(after.TotalAlloc-before.TotalAlloc) / rounds
	if perFrame > 1.25*MaxData {
		t.Fatalf("%.0f bytes allocated per data frame round trip, want about one payload (%d)", perFrame, MaxData)
	}
}

// TestCopiesUseWholeFrames: WriteFile sends a file in frames of MaxData
// (plus the request and the end), and the agent's answer to a read
// should be read the same way; fewer frames are fewer writes and wake-ups.
func TestCopiesUseWholeFrames(t *testing.T) {
	host, agent := net.Pipe()
	defer host.Close()
	frames := make(chan int, 1)
	go func() {
		n := 0
		for {
			m, err := Read(agent)
			if err != nil {
				frames <- n
				return
			}
			n++
			switch {
			case m.Type == THello:
				Write(agent, &Message{Type: THello, ID: m.ID, Version: Version})
			case m.Type == TData && m.EOF:
				Write(agent, &Message{Type: TOK, ID: m.Ref})
			}
		}
	}()
	c := NewClient(host)
	if _, _, err := c.Hello(t.Context()); err != nil {
		t.Fatal(err)
	}
	const size = 8*MaxData + 1
	if _, err := c.WriteFile(t.Context(), "/f", 0, io.LimitReader(zeros{}, size)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// hello, write, 9 data frames, the end.
	if n := <-frames; n != 12 {
		t.Fatalf("%d frames for a write of %d bytes, want 12 (frames of %d)", n, size, MaxData)
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// TestLargeDataFrameIsOneMessage: a frame whose data is written from the
// caller's slice on a socket (after the other fields, patched into their
// map) is the
// same message the plain encoder makes, for every map header size, and a
// stream cut inside it reads as cut short.
func TestLargeDataFrameIsOneMessage(t *testing.T) {
	data := make([]byte, inlineData+1)
	for i := range data {
		data[i] = byte(i)
	}
	msgs := []*Message{
		{Type: TData, ID: 9, Ref: 3, Data: data, EOF: true}, // fixmap
		{Type: TData, ID: 9, Version: 1, Agent: "a", DeadlineMs: 1, Paths: []string{"/"}, Argv: []string{"x"}, Env: []string{"A=1"},
			Cwd: "/", Stdin: true, TTY: true, Ref: 3, Signal: 2, Code: 1, EOF: true, Path: "/p", Mode: 0o600, Size: 5, Error: "e", Data: data}, // map 16
	}
	for _, m := range msgs {
		frame := overSocket(t, m)
		plain, err := Decode(frame[4:])
		if err != nil {
			t.Fatalf("the frame does not decode as one message: %v", err)
		}
		if !reflect.DeepEqual(plain, m) {
			t.Fatalf("decoded %+v, want %+v", plain, m)
		}
		if got, err := NewFrameReader(bytes.NewReader(frame)).Read(); err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("frame reader: %v", err)
		}
		for _, cut := range []int{5, 40, len(frame) - 1} {
			if _, err := NewFrameReader(bytes.NewReader(frame[:cut])).Read(); err != io.ErrUnexpectedEOF {
				t.Errorf("cut at %d of %d: %v, want io.ErrUnexpectedEOF", cut, len(frame), err)
			}
		}
	}
}

// TestDataLengthIsBoundedBeforeAllocating: a bin header claiming 2 GiB in
// a short frame is a protocol error, found before anything that size is
// allocated (msgpack alone allocates the claimed length first).
func TestDataLengthIsBoundedBeforeAllocating(t *testing.T) {
	body := []byte("\x83\xa4type\xa4data\xa2id\x05\xa4data\xc6\x79\x79\x79\x79yyyyyyyy")
	frame := append([]byte{0, 0, 0, byte(len(body))}, body...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, derr := Decode(body)
	_, rerr := NewFrameReader(bytes.NewReader(frame)).Read()
	runtime.ReadMemStats(&after)
	for _, err := range []error{derr, rerr} {
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("a 2 GiB data claim: %v, want a protocol error", err)
		}
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("refusing it allocated %d bytes", n)
	}
}

// writeCounter counts its writer's Write calls.
type writeCounter struct {
	bytes.Buffer
	calls int
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.calls++
	return w.Buffer.Write(p)
}

// TestLargeFrameIsOneWrite: a frame reaches a writer that is not a socket
// in one Write call, data included: the agent's virtio-serial port writer
// keeps frames of concurrent sessions whole by serialising Write calls,
// and a frame in two calls could have another's between its halves. On a
// unix socket it is written from the caller's slice.
func TestLargeFrameIsOneWrite(t *testing.T) {
	m := &Message{Type: TData, ID: 2, Ref: 1, Data: bytes.Repeat([]byte{1}, MaxData)}
	var w writeCounter
	if err := NewFrameWriter(&w).Write(m); err != nil {
		t.Fatal(err)
	}
	if w.calls != 1 {
		t.Fatalf("one frame in %d Write calls, want 1", w.calls)
	}
	if got, err := Read(&w.Buffer); err != nil || !bytes.Equal(got.Data, m.Data) {
		t.Fatalf("read back: %v", err)
	}
	if !isSocket(unixPair(t)) {
		t.Fatal("a unix socket is not written with writev")
	}
}

func unixPair(t testing.TB) net.Conn {
	c, _ := unixConns(t)
	return c
}

// unixConns is both ends of a unix stream connection.
func unixConns(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// overSocket is the bytes of m's frame as a FrameWriter sends them on a
// unix socket (its data after the other fields, by writev).
func overSocket(t testing.TB, m *Message) []byte {
	t.Helper()
	c, s := unixConns(t)
	errc := make(chan error, 1)
	go func() {
		errc <- NewFrameWriter(c).Write(m)
		c.Close()
	}()
	b, err := io.ReadAll(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReleasedDataIsReused: a receiver that hands each frame's data back
// once written on (as the agent's file writes and the client's cp do)
// reads the next frames into the same buffers instead of allocating a
// payload per frame, which kept a small-heap receiver collecting garbage
// every few frames.
func TestReleasedDataIsReused(t *testing.T) {
	// A buffer put back on one P is found by a Get on another only from
	// that P's shared list, never its private slot: a goroutine the
	// scheduler moves between Ps (it does, on a loaded machine) would miss
	// buffers the pool holds. On one P the test sees the reuse alone.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	m := &Message{Type: TData, ID: 2, Ref: 1, Data: bytes.Repeat([]byte{7}, MaxData)}
	var wire bytes.Buffer
	w, r := NewFrameWriter(&wire), NewFrameReader(&wire)
	roundTrip := func() {
		wire.Reset()
		if err := w.Write(m); err != nil {
			t.Fatal(err)
		}
		got, err := r.Read()
		if err != nil || !bytes.Equal(got.Data, m.Data) {
			t.Fatalf("read back %v", err)
		}
		ReleaseData(got.Data)
	}
	roundTrip()
	const rounds = 40
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < rounds; i++ {
		roundTrip()
	}
	runtime.ReadMemStats(&after)
	// The race detector's sync.Pool drops a quarter of what it is given.
	if perFrame := float64(after.TotalAlloc-before.TotalAlloc) / rounds; perFrame > MaxData/2 {
		t.Fatalf("%.0f bytes allocated per frame read and released, want the payload's buffer reused", perFrame)
	}
}
