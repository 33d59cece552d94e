package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestRoundTrip(t *testing.T) {
	msgs := []*Message{
		{Type: THello, ID: 1, Version: Version},
		{Type: TFreeze, ID: 2, DeadlineMs: 5000},
		{Type: TOK, ID: 2, Paths: []string{"/", "/workspace"}},
		{Type: TExec, ID: 3, Argv: []string{"sh", "-c", "echo hi"}, Env: []string{"A=1"}, Cwd: "/tmp", Stdin: true},
		{Type: TData, ID: 4, Ref: 3, Data: []byte{0, 1, 2, 255}, EOF: true},
		{Type: TExit, ID: 3, Code: 7},
		{Type: TExit, ID: 3, Signal: 9},
		{Type: TWrite, ID: 5, Path: "/x", Mode: 0o600},
		{Type: TError, ID: 6, Error: "no"},
	}
	var buf bytes.Buffer
	for _, m := range msgs {
		if err := Write(&buf, m); err != nil {
			t.Fatalf("write %+v: %v", m, err)
		}
	}
	for _, want := range msgs {
		got, err := Read(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v, want %+v", got, want)
		}
	}
	if _, err := Read(&buf); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestRefused(t *testing.T) {
	bad := []*Message{
		{Type: TPing},                  // no id
		{Type: THello, ID: 1},          // no version
		{Type: TExec, ID: 1},           // no argv
		{Type: TSignal, ID: 1, Ref: 2}, // no signal
		{Type: TData, ID: 1},           // no ref
		{Type: TRead, ID: 1},           // no path
		{Type: TWrite, ID: 1, Path: "/x", Mode: 0o10000},
		{Type: TFreeze, ID: 1, DeadlineMs: -1},
		{Type: TError, ID: 1},
		{Type: TData, ID: 1, Ref: 1, Data: make([]byte, MaxData+1)},
	}
	for _, m := range bad {
		if _, err := Encode(m); !errors.Is(err, ErrProtocol) {
			t.Errorf("%+v encoded: %v", m, err)
		}
	}
}

func TestOversizedFrameRefusedBeforeBody(t *testing.T) {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxFrame+1)
	// No body follows: a reader that tried to read it would report EOF.
	_, err := Read(bytes.NewReader(hdr[:]))
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("got %v, want a protocol error", err)
	}
}

func TestTruncatedFrame(t *testing.T) {
	b, err := Encode(&Message{Type: TPing, ID: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Read(bytes.NewReader(b[:len(b)-1])); err != io.ErrUnexpectedEOF {
		t.Fatalf("got %v, want io.ErrUnexpectedEOF", err)
	}
}

func TestTrailingBytesRefused(t *testing.T) {
	b, err := Encode(&Message{Type: TPing, ID: 1})
	if err != nil {
		t.Fatal(err)
	}
	body := append(append([]byte{}, b[4:]...), 0xc0)
	if _, err := Decode(body); !errors.Is(err, ErrProtocol) {
		t.Fatalf("got %v, want a protocol error", err)
	}
}

func TestDiskSerial(t *testing.T) {
	if got := DiskSerial(SerialVolume, "data"); got != "nexus-vol-data" {
		t.Fatalf("short name: %q", got)
	}
	long := DiskSerial(SerialVolume, "a-rather-long-volume")
	if len(long) != SerialBytes || !strings.HasPrefix(long, SerialVolume) {
		t.Fatalf("long name: %q", long)
	}
	if long == DiskSerial(SerialVolume, "a-rather-long-volumf") {
		t.Fatal("two long names share a serial")
	}
	// A name that would fill exactly SerialBytes is hashed too, so no
	// name that fits can spell a hashed serial.
	nine := DiskSerial(SerialVolume, "0123456789")
	if nine == SerialVolume+"0123456789" {
		t.Fatalf("a 20-byte serial was kept: %q", nine)
	}
	if got := DiskSerial(SerialShadow, "abcdef"); got != "nexus-shadow-abcdef" {
		t.Fatalf("shadow: %q", got)
	}
}

func FuzzDecode(f *testing.F) {
	for _, m := range []*Message{
		{Type: THello, ID: 1, Version: 1},
		{Type: TExec, ID: 3, Argv: []string{"true"}},
		{Type: TData, ID: 4, Ref: 3, Data: []byte("x")},
	} {
		b, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0, 0, 0, 1, 0xc1})
	// A frame whose data the writer sends after the other fields.
	f.Add(overSocket(f, &Message{Type: TData, ID: 5, Ref: 3, Data: bytes.Repeat([]byte("y"), inlineData+1)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Read(bytes.NewReader(b))
		// Read decodes from the stream; on a whole frame it must agree
		// with Decode of the same body.
		if len(b) >= 4 {
			if n := int(binary.BigEndian.Uint32(b)); n <= len(b)-4 {
				dm, derr := Decode(b[4 : 4+n])
				if (err == nil) != (derr == nil) || (err == nil && !reflect.DeepEqual(m, dm)) {
					t.Fatalf("Read: %+v, %v; Decode: %+v, %v", m, err, dm, derr)
				}
			}
		}
		if err != nil {
			return
		}
		// Whatever decodes must be valid and re-encode to the same message.
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded an invalid message: %v", err)
		}
		again, err := Encode(m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		m2, err := Read(bytes.NewReader(again))
		if err != nil {
			t.Fatalf("re-read: %v", err)
		}
		if !reflect.DeepEqual(normal(m), normal(m2)) {
			t.Fatalf("round trip changed %+v into %+v", m, m2)
		}
	})
}

// normal treats empty and nil slices alike: omitempty drops both.
func normal(m *Message) Message {
	c := *m
	if len(c.Paths) == 0 {
		c.Paths = nil
	}
	if len(c.Argv) == 0 {
		c.Argv = nil
	}
	if len(c.Env) == 0 {
		c.Env = nil
	}
	if len(c.Data) == 0 {
		c.Data = nil
	}
	return c
}

// TestUnknownTypeIsAnswerable: a newer peer's request type decodes with
// ErrUnknownType and its id, not as a broken stream.
func TestUnknownTypeIsAnswerable(t *testing.T) {
	body, err := msgpack.Marshal(map[string]any{"type": "snapshot-memory", "id": 7})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(body)
	if !errors.Is(err, ErrUnknownType) || errors.Is(err, ErrProtocol) || m == nil || m.ID != 7 {
		t.Fatalf("got %+v, %v", m, err)
	}
	if _, err := Encode(&Message{Type: "reboot", ID: 1}); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("encoded an unknown type: %v", err)
	}
}
