package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// requestSeeds are request bodies, valid and not, for the request fuzz
// targets.
var requestSeeds = [][]any{
	{arr(3), 1, "ping", mapHdr(0)},
	{arr(3), 0, "decref", mapHdr(1), "name", "anon-lock-00"},
	{arr(3), uint64(1 << 63), "acquire", mapHdr(4), "kind", "lock", "name", "l", "timeout", 1.5, "block", true},
	{arr(3), 2, "put", mapHdr(3), "kind", "queue", "name", "q", "item", []byte{0, 1}},
	{arr(3), 3, "set", mapHdr(3), "kind", "value", "name", "v", "value", nil},
	{arr(3), 1, "ping", mapHdr(1), "k", []any{1}},
	{arr(3), 1, "ping", mapHdr(1), "k", map[string]any{"a": 1}},
	{arr(3), -1, "ping", mapHdr(0)},
	{arr(3), 1, []byte("ping"), mapHdr(0)},
	{arr(3), 1, "ping", raw{0xdf, 0xff, 0xff, 0xff, 0xff}},
	{arr(3), 1, "ping", mapHdr(1), "k", raw{0xc6, 0xff, 0xff, 0xff, 0xff}},
	{arr(2), 1, "ping"},
	{"ping"},
}

func FuzzDecodeRequest(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add(build(f, s...))
	}
	f.Add([]byte{})
	f.Add([]byte{0x93, 0x01, 0xa4, 'p', 'i', 'n', 'g', 0x80, 0x00})
	f.Add(bytes.Repeat([]byte{0x91}, 1000))
	f.Add([]byte{0xdc, 0x00, 0x03, 0xcf, 0xff, 0, 0, 0, 0, 0, 0, 0x01, 0xa4, 'p', 'i', 'n', 'g', 0x80}) // array16, uint64 id
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := DecodeRequest(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		// The id the daemon answers an oversized frame under is the one the
		// full decoder reads, from the first MaxIDPrefix bytes alone.
		if id, err := PeekRequestID(b[:min(len(b), MaxIDPrefix)]); err != nil || id != req.ID {
			t.Fatalf("PeekRequestID: %d, %v; DecodeRequest: %d", id, err, req.ID)
		}
		if len(req.Args) > MaxArgs {
			t.Fatalf("%d args accepted", len(req.Args))
		}
		for k, v := range req.Args.Map() {
			switch v.(type) {
			case nil, bool, int64, uint64, float64, string, []byte:
			default:
				t.Fatalf("arg %q has type %T", k, v)
			}
		}
		// What decodes re-encodes to something that decodes the same.
		frame, err := EncodeRequest(req.ID, req.Op, req.Args.Map())
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := DecodeRequest(frame[HeaderSize:])
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if again.ID != req.ID || again.Op != req.Op || !sameArgs(again.Args, req.Args) {
			t.Fatalf("round trip changed the request: %+v -> %+v", req, again)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{}, uint32(16))
	f.Add([]byte{0, 0, 0, 1, 0xc0}, uint32(16))
	f.Add([]byte{0, 0, 0, 0}, uint32(16))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3}, uint32(DefaultMaxFrame))
	f.Add([]byte{0, 0, 0, 5, 1, 2}, uint32(16))
	f.Add([]byte{0, 0, 0x10, 0x01}, uint32(HandshakeMaxFrame))
	f.Add([]byte{0, 0, 0, 2, 1, 2, 0, 0, 0, 1, 9}, uint32(2))
	f.Fuzz(func(t *testing.T, in []byte, max uint32) {
		r := bytes.NewReader(in)
		for frames := 0; ; frames++ {
			before := r.Len()
			body, err := ReadFrame(r, max)
			consumed := before - r.Len()
			if err != nil {
				if body != nil {
					t.Fatal("body returned with an error")
				}
				switch {
				case errors.Is(err, ErrFrameTooLarge), errors.Is(err, ErrEmptyFrame):
					if consumed != HeaderSize {
						t.Fatalf("a refused frame consumed %d bytes", consumed)
					}
				case err == io.EOF:
					if consumed != 0 {
						t.Fatalf("EOF after consuming %d bytes", consumed)
					}
				case errors.Is(err, io.ErrUnexpectedEOF):
				default:
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(body) == 0 || uint64(len(body)) > uint64(max) {
				t.Fatalf("body of %d bytes with limit %d", len(body), max)
			}
			if consumed != HeaderSize+len(body) {
				t.Fatalf("consumed %d bytes for a body of %d", consumed, len(body))
			}
			var out bytes.Buffer
			if err := WriteFrame(&out, body); err != nil || !bytes.Equal(out.Bytes(), in[len(in)-before:len(in)-before+consumed]) {
				t.Fatalf("re-encoding differs: %v", err)
			}
		}
	})
}
