package proxy_test

import (
	"bytes"
	"encoding/hex"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/syncmgr/syncmgr/proxy"
)

// The bytes Python's client computes (syncmgr._containers.canonical_key) for
// the same keys: a Go key must find what Python stored, and the reverse.
func TestCanonicalKeysMatchPython(t *testing.T) {
	for _, tc := range []struct {
		key  any
		want string
	}{
		{nil, "6dc0"},
		{true, "6d01"},
		{false, "6d00"},
		{0, "6d00"},
		{int8(1), "6d01"},
		{-1, "6dff"},
		{1.0, "6d01"},
		{1.5, "6dcb3ff8000000000000"},
		{int64(math.MinInt64), "6dd38000000000000000"},
		{uint64(math.MaxUint64), "6dcfffffffffffffffff"},
		{uint64(1 << 63), "6dcf8000000000000000"},
		{"a", "6da161"},
		{"é", "6da2c3a9"},
		{strings.Repeat("x", 40), "6dd928" + strings.Repeat("78", 40)},
		{strings.Repeat("x", 300), "6dda012c" + strings.Repeat("78", 300)},
		{[]byte{0, 0xff}, "6dc40200ff"},
		{[]any{1, "a", []byte("b")}, "6d9301a161c40162"},
		{[]any{1, []int{2, 3}}, "6d9201920203"},
		{1e20, "6dc71501313030303030303030303030303030303030303030"},
		{math.Inf(1), "6dcb7ff0000000000000"},
		{math.Copysign(0, -1), "6d00"},
		{-129, "6dd1ff7f"},
		{70000, "6dce00011170"},
	} {
		got, err := proxy.CanonicalKey(tc.key)
		if err != nil {
			t.Errorf("CanonicalKey(%#v): %v", tc.key, err)
			continue
		}
		if hex.EncodeToString(got) != tc.want {
			t.Errorf("CanonicalKey(%#v) = %x, Python computes %s", tc.key, got, tc.want)
		}
	}
	if _, err := proxy.CanonicalKey(map[string]int{}); err == nil {
		t.Error("a map key was accepted")
	}
}

// Values as Python's client stores them (syncmgr._values.dumps).
func TestDecodeValuesPythonWrote(t *testing.T) {
	for _, tc := range []struct {
		hex  string
		want any
	}{
		{"c1c0", nil},
		{"c1c3", true},
		{"c100", int64(0)},
		{"c1ff", int64(-1)},
		{"c1cf8000000000000000", uint64(1 << 63)},
		{"c1cb3ff8000000000000", 1.5},
		{"c1a3737472", "str"},
		{"c1c4056279746573", []byte("bytes")},
		{"c19301a161c0", []any{int64(1), "a", nil}},
		{"c182a16101a16291c3", map[string]any{"a": int64(1), "b": []any{true}}},
		{"c18101a178", map[any]any{int64(1): "x"}},
		{"c181c4016b01", map[any]any{proxy.BytesKey("k"): int64(1)}},
		{"80054b012e", proxy.Pickle(mustHex("80054b012e"))},
	} {
		got, err := proxy.DecodeValue(mustHex(tc.hex))
		if err != nil {
			t.Errorf("DecodeValue(%s): %v", tc.hex, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DecodeValue(%s) = %#v, want %#v", tc.hex, got, tc.want)
		}
	}
	for _, bad := range []string{"c1", "c1c1", "c1a3", "c10000", "c1819101c0", "c181c0"} {
		if v, err := proxy.DecodeValue(mustHex(bad)); err == nil {
			t.Errorf("DecodeValue(%s) = %#v, want an error", bad, v)
		}
	}
}

func TestEncodeValueRoundTrips(t *testing.T) {
	for _, v := range []any{nil, true, int64(-5), uint64(1 << 63), 2.5, "héllo", []byte{1, 2},
		[]any{int64(1), "a", []any{nil}}, map[string]any{"k": []any{int64(1), 2.5}}} {
		b, err := proxy.EncodeValue(v)
		if err != nil || b[0] != proxy.ValueTag {
			t.Fatalf("EncodeValue(%#v) = %x, %v", v, b, err)
		}
		got, err := proxy.DecodeValue(b)
		if err != nil || !reflect.DeepEqual(got, v) {
			t.Errorf("round trip of %#v: %#v, %v", v, got, err)
		}
	}
	// Python's bytes for the same small values: ints in their smallest form.
	for v, want := range map[int]string{0: "c100", -1: "c1ff", 70000: "c1ce00011170", 200: "c1ccc8"} {
		if b, _ := proxy.EncodeValue(v); hex.EncodeToString(b) != want {
			t.Errorf("EncodeValue(%d) = %x, Python writes %s", v, b, want)
		}
	}
	// A bytes key from Python goes back as bytes.
	if b, _ := proxy.EncodeValue(map[any]any{proxy.BytesKey("k"): 1}); hex.EncodeToString(b) != "c181c4016b01" {
		t.Errorf("EncodeValue(BytesKey map) = %x", b)
	}
	// A Pickle goes back as it came.
	p := proxy.Pickle(mustHex("80054b012e"))
	if b, _ := proxy.EncodeValue(p); !bytes.Equal(b, p) {
		t.Errorf("EncodeValue(Pickle) = %x", b)
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzDecodeValue: no input makes DecodeValue panic, and whatever decodes
// encodes again.
func FuzzDecodeValue(f *testing.F) {
	for _, s := range []string{"c1c0", "c19301a161c0", "c182a16101a16291c3", "c181c4016b01", "c1819101c0", "80054b012e"} {
		f.Add(mustHex(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := proxy.DecodeValue(b)
		if err != nil {
			return
		}
		if _, err := proxy.EncodeValue(v); err != nil {
			t.Fatalf("decoded %x to %#v, which does not encode: %v", b, v, err)
		}
	})
}
