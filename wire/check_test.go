package wire

import (
	"bytes"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
)

// validValues are encodings of every MessagePack format.
func validValues(t testing.TB) map[string][]byte {
	t.Helper()
	return map[string][]byte{
		"nil":       build(t, nil),
		"bools":     build(t, arr(2), true, false),
		"fixints":   build(t, arr(3), 0, 127, -32),
		"ints":      build(t, arr(8), raw{0xcc, 1}, raw{0xcd, 1, 2}, raw{0xce, 1, 2, 3, 4}, raw{0xcf, 1, 2, 3, 4, 5, 6, 7, 8}, raw{0xd0, 1}, raw{0xd1, 1, 2}, raw{0xd2, 1, 2, 3, 4}, raw{0xd3, 1, 2, 3, 4, 5, 6, 7, 8}),
		"floats":    build(t, arr(2), float32(1.5), math.Pi),
		"fixstr":    build(t, "hello"),
		"str8":      build(t, strings.Repeat("x", 200)),
		"str16":     build(t, strings.Repeat("x", 300)),
		"str32":     build(t, strings.Repeat("x", 70000)),
		"bins":      build(t, arr(3), []byte{}, bytes.Repeat([]byte{1}, 300), bytes.Repeat([]byte{1}, 70000)),
		"fixexts":   build(t, arr(5), raw{0xd4, 1, 0}, raw{0xd5, 1, 0, 0}, raw{0xd6, 1, 0, 0, 0, 0}, raw{0xd7, 1, 0, 0, 0, 0, 0, 0, 0, 0}, append([]byte{0xd8, 1}, make([]byte, 16)...)),
		"exts":      build(t, arr(3), raw{0xc7, 2, 5, 0, 0}, raw{0xc8, 0, 1, 5, 0}, raw{0xc9, 0, 0, 0, 1, 5, 0}),
		"fixmap":    build(t, map[string]any{"a": 1, "b": []any{1, "x"}}),
		"array16":   build(t, make([]any, 20)),
		"array32":   build(t, raw{0xdd, 0, 0, 0, 2}, 1, 2),
		"map16":     build(t, raw{0xde, 0, 1}, "k", "v"),
		"map32":     build(t, raw{0xdf, 0, 0, 0, 1}, "k", "v"),
		"nested":    build(t, []any{[]any{[]any{map[string]any{"x": []any{nil}}}}}),
		"request":   build(t, arr(3), 1, "ping", mapHdr(0)),
		"empty arr": build(t, arr(0)),
	}
}

func TestCheckSizes(t *testing.T) {
	for name, v := range validValues(t) {
		t.Run(name, func(t *testing.T) {
			if err := checkSizes(v); err != nil {
				t.Fatalf("valid value refused: %v", err)
			}
			for i := 0; i < len(v); i++ {
				if err := checkSizes(v[:i]); err == nil {
					t.Fatalf("prefix of %d of %d bytes accepted", i, len(v))
				}
			}
			if err := checkSizes(append(v[:len(v):len(v)], 0xc0)); err == nil {
				t.Fatal("trailing byte accepted")
			}
		})
	}
	bad := map[string][]byte{
		"reserved": {0xc1},
		"bin32 4G": {0xc6, 0xff, 0xff, 0xff, 0xff, 0},
		"str32 4G": {0xdb, 0xff, 0xff, 0xff, 0xff, 0},
		"ext32 4G": {0xc9, 0xff, 0xff, 0xff, 0xff, 1},
		"arr32 4G": {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0},
		"map32 4G": {0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0, 0xc0},
		"map half": {0x81, 0xc0},
		"arr long": {0x92, 0xc0},
	}
	for name, v := range bad {
		if err := checkSizes(v); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestHostileLengthsDoNotAllocate: a short message declaring a huge str or
// bin must be refused without allocating the declared size, by every entry
// point that decodes peer input.
func TestHostileLengthsDoNotAllocate(t *testing.T) {
	bin32 := []byte{0xc6, 0x7f, 0xff, 0xff, 0xff}
	str32 := []byte{0xdb, 0x7f, 0xff, 0xff, 0xff}
	var authMsg struct {
		T     string `msgpack:"t"`
		Nonce []byte `msgpack:"nonce"`
	}
	cases := map[string]func() error{
		"request arg": func() error {
			_, err := DecodeRequest(build(t, arr(3), 1, "op", mapHdr(1), "k", raw(bin32)))
			return err
		},
		"request op": func() error {
			_, err := DecodeRequest(build(t, arr(3), 1, raw(str32)))
			return err
		},
		"reply result": func() error {
			_, err := DecodeReply(build(t, arr(3), 1, nil, raw(bin32)))
			return err
		},
		"unmarshal bin": func() error {
			return Unmarshal(build(t, mapHdr(2), "t", "auth", "nonce", raw(bin32)), &authMsg)
		},
		"unmarshal str": func() error {
			return Unmarshal(build(t, mapHdr(1), "t", raw(str32)), &authMsg)
		},
		"unmarshal array": func() error {
			var xs []int
			return Unmarshal([]byte{0xdd, 0x7f, 0xff, 0xff, 0xff, 1}, &xs)
		},
	}
	for name, fn := range cases {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := fn()
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want ErrMalformed", err)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
				t.Fatalf("allocated %d bytes", n)
			}
		})
	}
}
