package control

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/nexus-sandbox/nexus/guard"
)

// Frames round-trip, and any bytes a peer sends decode to a frame or an
// error, never a panic or an allocation beyond the frame.
func FuzzAppendStreamFrames(f *testing.F) {
	req := &streamRequest{ID: 7, Events: [][]byte{{0x81, 0xa1, 0x74, 0x01}, {}}, Expect: []guard.Expect{{Entity: "sandbox/X", Seq: 3}}}
	resp := &streamResponse{ID: 7, Seqs: []uint64{4, 5}, Error: "e", Conflict: true, Stale: &guard.StaleError{Entity: "sandbox/X", Expected: 3, Actual: 9, Latest: "sandbox.created"}}
	var seeds [][]byte
	for _, enc := range []func(*frameWriter) error{
		func(fw *frameWriter) error { return fw.request(req) },
		func(fw *frameWriter) error { return fw.response(resp) },
		func(fw *frameWriter) error { return fw.response(&streamResponse{ID: 1}) },
	} {
		fw := newFrameWriter()
		if err := enc(fw); err != nil {
			f.Fatal(err)
		}
		var buf bytes.Buffer
		if err := fw.send(&buf); err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, buf.Bytes())
		f.Add(buf.Bytes())
	}
	got, err := newFrameReader(bytes.NewReader(seeds[0])).request()
	if err != nil || !reflect.DeepEqual(got, req) {
		f.Fatalf("request round trip: %+v, %v", got, err)
	}
	gotResp, err := newFrameReader(bytes.NewReader(seeds[1])).response()
	if err != nil || !reflect.DeepEqual(gotResp, resp) {
		f.Fatalf("response round trip: %+v, %v", gotResp, err)
	}
	// A frame announcing a billion events in a few bytes is refused.
	f.Add([]byte{0, 0, 0, 8, 0x93, 0x01, 0xdd, 0x40, 0, 0, 0, 0xc0})
	f.Fuzz(func(t *testing.T, data []byte) {
		newFrameReader(bytes.NewReader(data)).request()
		newFrameReader(bytes.NewReader(data)).response()
	})
}
