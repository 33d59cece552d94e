package wire

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/nexus-sandbox/nexus/core"
)

// Frames round-trip, and any bytes a peer sends decode to a frame or an
// error, never a panic or an allocation beyond the frame.
func FuzzAppendStreamFrames(f *testing.F) {
	req := &AppendRequest{ID: 7, Events: [][]byte{{0x81, 0xa1, 0x74, 0x01}, {}}, Expect: []core.Expect{{Entity: "sandbox/X", Seq: 3}}}
	resp := &AppendResponse{ID: 7, Seqs: []uint64{4, 5}, Error: "e", Conflict: true, Stale: &core.StaleError{Entity: "sandbox/X", Expected: 3, Actual: 9, Latest: "sandbox.created"}}
	var seeds [][]byte
	for _, enc := range []func(*FrameWriter) error{
		func(fw *FrameWriter) error { return fw.Request(req) },
		func(fw *FrameWriter) error { return fw.Response(resp) },
		func(fw *FrameWriter) error { return fw.Response(&AppendResponse{ID: 1}) },
	} {
		fw := NewFrameWriter()
		if err := enc(fw); err != nil {
			f.Fatal(err)
		}
		var buf bytes.Buffer
		if err := fw.Send(&buf); err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, buf.Bytes())
		f.Add(buf.Bytes())
	}
	got, err := NewFrameReader(bytes.NewReader(seeds[0])).Request()
	if err != nil || !reflect.DeepEqual(got, req) {
		f.Fatalf("request round trip: %+v, %v", got, err)
	}
	gotResp, err := NewFrameReader(bytes.NewReader(seeds[1])).Response()
	if err != nil || !reflect.DeepEqual(gotResp, resp) {
		f.Fatalf("response round trip: %+v, %v", gotResp, err)
	}
	// A frame announcing a billion events in a few bytes is refused.
	f.Add([]byte{0, 0, 0, 8, 0x93, 0x01, 0xdd, 0x40, 0, 0, 0, 0xc0})
	f.Fuzz(func(t *testing.T, data []byte) {
		NewFrameReader(bytes.NewReader(data)).Request()
		NewFrameReader(bytes.NewReader(data)).Response()
	})
}
