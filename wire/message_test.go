package wire

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// mp encodes the values one after another, each as MessagePack, so that
// tests can build any shape, including malformed ones.
func mp(t testing.TB, vs ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	for _, v := range vs {
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// arr is a MessagePack array header of n elements.
type arr int

// mapHdr is a MessagePack map header of n entries.
type mapHdr int

// raw is already-encoded MessagePack.
type raw []byte

// build encodes a sequence of headers, raw bytes and values.
func build(t testing.TB, parts ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	for _, p := range parts {
		var err error
		switch v := p.(type) {
		case arr:
			err = enc.EncodeArrayLen(int(v))
		case mapHdr:
			err = enc.EncodeMapLen(int(v))
		case raw:
			buf.Write(v)
		default:
			err = enc.Encode(v)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// unframe returns a func stripping the frame header from an encoded
// request or reply: unframe(t)(EncodeRequest(...)).
func unframe(t testing.TB) func(frame []byte, err error) []byte {
	return func(frame []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if len(frame) < HeaderSize {
			t.Fatalf("frame of %d bytes", len(frame))
		}
		return frame[HeaderSize:]
	}
}

func TestRequestRoundTrip(t *testing.T) {
	tests := []struct {
		id   uint64
		op   string
		args map[string]any
		want map[string]any
	}{
		{0, "ping", nil, map[string]any{}},
		{1, "ping", map[string]any{}, map[string]any{}},
		{math.MaxUint64, "create", map[string]any{"kind": "lock", "name": "a"}, map[string]any{"kind": "lock", "name": "a"}},
		{7, "set", map[string]any{
			"nil": nil, "t": true, "f": false, "neg": int64(-5), "small": 3, "big": uint64(math.MaxUint64),
			"float": 1.5, "f32": float32(0.25), "str": "héllo", "bin": []byte{0, 1, 2}, "empty": []byte{},
		}, map[string]any{
			"nil": nil, "t": true, "f": false, "neg": int64(-5), "small": int64(3), "big": uint64(math.MaxUint64),
			"float": 1.5, "f32": 0.25, "str": "héllo", "bin": []byte{0, 1, 2}, "empty": []byte{},
		}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d-%s", tt.id, tt.op), func(t *testing.T) {
			frame, err := EncodeRequest(tt.id, tt.op, tt.args)
			b := unframe(t)(frame, err)
			if got, err := ReadFrame(bytes.NewReader(frame), DefaultMaxFrame); err != nil || !bytes.Equal(got, b) {
				t.Fatalf("frame header is wrong: %v", err)
			}
			req, err := DecodeRequest(b)
			if err != nil {
				t.Fatal(err)
			}
			if req.ID != tt.id || req.Op != tt.op {
				t.Fatalf("got id %d op %q", req.ID, req.Op)
			}
			if !reflect.DeepEqual(req.Args.Map(), tt.want) {
				t.Fatalf("args:\n got %#v\nwant %#v", req.Args, tt.want)
			}
		})
	}
}

// A key given twice counts once, with its last value, as the map it is
// on the wire would: the reference decoder (msgpack's) does the same.
func TestRequestArgGivenTwice(t *testing.T) {
	body := []byte{0x93, 0x01, 0xa1, 'x', 0x83, 0xa1, 'k', 0x01, 0xa4, 'n', 'a', 'm', 'e', 0xa1, 'q', 0xa1, 'k', 0x02}
	req, err := DecodeRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := req.Args.Lookup("k"); !ok || v != int64(2) {
		t.Fatalf("k = %v, %v; want the last value, 2", v, ok)
	}
	if name, _ := req.Args.String("name"); name != "q" {
		t.Fatalf("name = %q", name)
	}
	if v, ok := req.Args.Lookup("absent"); ok || v != nil {
		t.Fatalf("absent = %v, %v", v, ok)
	}
	if m := req.Args.Map(); len(m) != 2 || m["k"] != int64(2) {
		t.Fatalf("Map() = %v", m)
	}
}

func TestRequestMaxArgs(t *testing.T) {
	args := make(map[string]any, MaxArgs)
	for i := 0; i < MaxArgs; i++ {
		args[fmt.Sprint("k", i)] = i
	}
	req, err := DecodeRequest(unframe(t)(EncodeRequest(1, "op", args)))
	if err != nil || len(req.Args) != MaxArgs {
		t.Fatalf("%d args: %v", MaxArgs, err)
	}
	args["one-more"] = 1
	_, err = DecodeRequest(unframe(t)(EncodeRequest(1, "op", args)))
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("%d args: got %v, want ErrMalformed", MaxArgs+1, err)
	}
}

func TestDecodeRequestMalformed(t *testing.T) {
	valid := build(t, arr(3), 1, "ping", mapHdr(0))
	if _, err := DecodeRequest(valid); err != nil {
		t.Fatalf("the valid base case fails: %v", err)
	}
	deep := raw(bytes.Repeat([]byte{0x91}, 10000)) // [[[[...
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"nil", build(t, nil)},
		{"int", build(t, 5)},
		{"string", build(t, "ping")},
		{"map", build(t, map[string]any{"id": 1, "op": "ping"})},
		{"empty array", build(t, arr(0))},
		{"two elements", build(t, arr(2), 1, "ping")},
		{"four elements", build(t, arr(4), 1, "ping", mapHdr(0), nil)},
		{"array header only", build(t, arr(3))},
		{"truncated args", build(t, arr(3), 1, "ping", mapHdr(2), "a")},
		{"nil id", build(t, arr(3), nil, "ping", mapHdr(0))},
		{"negative id", build(t, arr(3), -1, "ping", mapHdr(0))},
		{"float id", build(t, arr(3), 1.0, "ping", mapHdr(0))},
		{"string id", build(t, arr(3), "1", "ping", mapHdr(0))},
		{"int op", build(t, arr(3), 1, 7, mapHdr(0))},
		{"nil op", build(t, arr(3), 1, nil, mapHdr(0))},
		{"bin op", build(t, arr(3), 1, []byte("ping"), mapHdr(0))},
		{"array op", build(t, arr(3), 1, arr(1), "ping", mapHdr(0))},
		{"nil args", build(t, arr(3), 1, "ping", nil)},
		{"array args", build(t, arr(3), 1, "ping", arr(0))},
		{"string args", build(t, arr(3), 1, "ping", "x")},
		{"int key", build(t, arr(3), 1, "ping", mapHdr(1), 1, 2)},
		{"nil key", build(t, arr(3), 1, "ping", mapHdr(1), nil, 2)},
		{"bin key", build(t, arr(3), 1, "ping", mapHdr(1), []byte("k"), 2)},
		{"array value", build(t, arr(3), 1, "ping", mapHdr(1), "k", []any{1})},
		{"map value", build(t, arr(3), 1, "ping", mapHdr(1), "k", map[string]any{"a": 1})},
		{"deeply nested value", build(t, arr(3), 1, "ping", mapHdr(1), "k", deep, nil)},
		{"ext value", build(t, arr(3), 1, "ping", mapHdr(1), "k", raw{0xd4, 0x01, 0x00})},
		{"reserved code 0xc1", build(t, arr(3), 1, "ping", mapHdr(1), "k", raw{0xc1})},
		{"trailing byte", append(valid[:len(valid):len(valid)], 0xc0)},
		{"two requests", append(valid[:len(valid):len(valid)], valid...)},
		{"65 args", func() []byte {
			parts := []any{arr(3), 1, "op", mapHdr(65)}
			for i := 0; i < 65; i++ {
				parts = append(parts, fmt.Sprint("k", i), i)
			}
			return build(t, parts...)
		}()},
		{"map32 claiming 4G args", build(t, arr(3), 1, "op", raw{0xdf, 0xff, 0xff, 0xff, 0xff})},
		{"array32 claiming 4G elements", build(t, raw{0xdd, 0xff, 0xff, 0xff, 0xff})},
		{"str32 claiming 4 GiB", build(t, arr(3), 1, raw{0xdb, 0xff, 0xff, 0xff, 0xff}, mapHdr(0))},
		{"bin32 claiming 4 GiB", build(t, arr(3), 1, "op", mapHdr(1), "k", raw{0xc6, 0xff, 0xff, 0xff, 0xff})},
		{"truncated string", build(t, arr(3), 1, raw{0xa5, 'p', 'i'})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := DecodeRequest(tt.in)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %+v, %v; want an error wrapping ErrMalformed", req, err)
			}
		})
	}
}

func TestReplyRoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		id     uint64
		err    *Error
		result any
		want   any
	}{
		{"nil", 1, nil, nil, nil},
		{"bool", 2, nil, true, true},
		{"int", 3, nil, 42, int64(42)},
		{"negative", 3, nil, -42, int64(-42)},
		{"uint64 above int64", 4, nil, uint64(math.MaxUint64), uint64(math.MaxUint64)},
		{"uint64 in int64 range", 4, nil, uint64(7), int64(7)},
		{"float", 5, nil, 2.5, 2.5},
		{"str", 6, nil, "x", "x"},
		{"bin", 7, nil, []byte{1, 2}, []byte{1, 2}},
		{"map", 8, nil, map[string]any{"name": "a", "created": true}, map[string]any{"name": "a", "created": true}},
		{"array", 9, nil, []any{[]byte("k"), []byte("v")}, []any{[]byte("k"), []byte("v")}},
		{"error", 10, &Error{Code: CodeEmpty, Message: "queue empty"}, nil, nil},
		{"error with id 0", 0, &Error{Code: CodeTooLarge, Message: "frame too large"}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := DecodeReply(unframe(t)(EncodeReply(tt.id, tt.err, tt.result)))
			if err != nil {
				t.Fatal(err)
			}
			if rep.ID != tt.id {
				t.Fatalf("id %d, want %d", rep.ID, tt.id)
			}
			if !reflect.DeepEqual(rep.Err, tt.err) {
				t.Fatalf("error %#v, want %#v", rep.Err, tt.err)
			}
			if !reflect.DeepEqual(rep.Result, tt.want) {
				t.Fatalf("result %#v (%T), want %#v (%T)", rep.Result, rep.Result, tt.want, tt.want)
			}
		})
	}
}

func TestDecodeReplyMalformed(t *testing.T) {
	nested := []any{arr(3), 1, nil}
	for i := 0; i <= maxDepth+1; i++ {
		nested = append(nested, arr(1))
	}
	nested = append(nested, nil)
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"not an array", build(t, "x")},
		{"two elements", build(t, arr(2), 1, nil)},
		{"error of one element", build(t, arr(3), 1, arr(1), "empty", nil)},
		{"error of three elements", build(t, arr(3), 1, arr(3), "a", "b", "c", nil)},
		{"error code not a string", build(t, arr(3), 1, arr(2), 1, "m", nil)},
		{"error is a string", build(t, arr(3), 1, "empty", nil)},
		{"missing result", build(t, arr(3), 1, nil)},
		{"nested too deep", build(t, nested...)},
		{"map key not a string", build(t, arr(3), 1, nil, mapHdr(1), 1, 2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if rep, err := DecodeReply(tt.in); !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %+v, %v; want ErrMalformed", rep, err)
			}
		})
	}
}

func TestEncodeRequestEncodesNestedArgs(t *testing.T) {
	// A Go caller can pass anything; the server must refuse nested values.
	frame, err := EncodeRequest(1, "set", map[string]any{"value": []any{1, 2}})
	if _, err := DecodeRequest(unframe(t)(frame, err)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("nested arg accepted: %v", err)
	}
}

func TestErrorIs(t *testing.T) {
	err := fmt.Errorf("get: %w", &Error{Code: CodeEmpty, Message: "queue empty"})
	if !errors.Is(err, &Error{Code: CodeEmpty}) {
		t.Fatal("errors.Is does not match by code")
	}
	if errors.Is(err, &Error{Code: CodeFull}) {
		t.Fatal("errors.Is matches another code")
	}
	if got := (&Error{Code: CodeFull}).Error(); got != "full" {
		t.Fatalf("Error() = %q", got)
	}
	if got := Errorf(CodeValueError, "x=%d", 3).Error(); got != "value_error: x=3" {
		t.Fatalf("Error() = %q", got)
	}
}

func TestArgAccessors(t *testing.T) {
	a := ArgsOf(map[string]any{"s": "str", "b": []byte("bin"), "t": true, "i": int64(-3), "u": uint64(4),
		"big": uint64(math.MaxUint64), "f": 1.5, "nil": nil})
	code := func(err error) Code {
		var we *Error
		if errors.As(err, &we) {
			return we.Code
		}
		return ""
	}
	if v, err := a.String("s"); v != "str" || err != nil {
		t.Errorf("String: %q %v", v, err)
	}
	if _, err := a.String("b"); code(err) != CodeBadRequest {
		t.Errorf("String of bin: %v", err)
	}
	if _, err := a.String("missing"); code(err) != CodeBadRequest {
		t.Errorf("String of missing: %v", err)
	}
	if v, err := a.OptString("nil"); v != "" || err != nil {
		t.Errorf("OptString of nil: %q %v", v, err)
	}
	if _, err := a.OptString("i"); code(err) != CodeBadRequest {
		t.Errorf("OptString of int: %v", err)
	}
	if v, err := a.Bytes("b"); string(v) != "bin" || err != nil {
		t.Errorf("Bytes: %q %v", v, err)
	}
	if _, err := a.Bytes("s"); code(err) != CodeBadRequest {
		t.Errorf("Bytes of str: %v", err)
	}
	if v, err := a.Bool("t", false); !v || err != nil {
		t.Errorf("Bool: %v %v", v, err)
	}
	if v, err := a.Bool("missing", true); !v || err != nil {
		t.Errorf("Bool default: %v %v", v, err)
	}
	if _, err := a.Bool("i", false); code(err) != CodeBadRequest {
		t.Errorf("Bool of int: %v", err)
	}
	if v, err := a.Int("i", 0); v != -3 || err != nil {
		t.Errorf("Int: %v %v", v, err)
	}
	if v, err := a.Int("u", 0); v != 4 || err != nil {
		t.Errorf("Int of uint: %v %v", v, err)
	}
	if _, err := a.Int("big", 0); code(err) != CodeValueError {
		t.Errorf("Int of huge uint: %v", err)
	}
	if _, err := a.Int("f", 0); code(err) != CodeBadRequest {
		t.Errorf("Int of float: %v", err)
	}
	if v, err := a.Int("missing", 9); v != 9 || err != nil {
		t.Errorf("Int default: %v %v", v, err)
	}
	if _, err := a.Uint("i", 0); code(err) != CodeValueError {
		t.Errorf("Uint of negative: %v", err)
	}
	if v, err := a.Uint("big", 0); v != math.MaxUint64 || err != nil {
		t.Errorf("Uint: %v %v", v, err)
	}
	if _, err := a.Uint("s", 0); code(err) != CodeBadRequest {
		t.Errorf("Uint of str: %v", err)
	}
}

func TestTimeout(t *testing.T) {
	tests := []struct {
		in   any
		secs float64
		ok   bool
		code Code
	}{
		{nil, 0, false, ""},
		{int64(0), 0, true, ""},
		{int64(3), 3, true, ""},
		{uint64(5), 5, true, ""},
		{0.25, 0.25, true, ""},
		{1e300, 1e300, true, ""},
		{int64(-1), 0, false, CodeValueError},
		{-0.5, 0, false, CodeValueError},
		{math.NaN(), 0, false, CodeValueError},
		{math.Inf(1), 0, false, CodeValueError},
		{math.Inf(-1), 0, false, CodeValueError},
		{"1", 0, false, CodeBadRequest},
		{true, 0, false, CodeBadRequest},
		{[]byte{1}, 0, false, CodeBadRequest},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.in), func(t *testing.T) {
			args := Args{}
			if tt.in != nil {
				args = ArgsOf(map[string]any{"timeout": tt.in})
			}
			secs, ok, err := args.Timeout()
			var we *Error
			switch {
			case tt.code == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tt.code != "" && (!errors.As(err, &we) || we.Code != tt.code):
				t.Fatalf("got %v, want code %s", err, tt.code)
			case secs != tt.secs || ok != tt.ok:
				t.Fatalf("got %v %v, want %v %v", secs, ok, tt.secs, tt.ok)
			}
		})
	}
}

func TestMarshalUnmarshal(t *testing.T) {
	type msg struct {
		T string `msgpack:"t"`
		N int    `msgpack:"n"`
	}
	b, err := Marshal(msg{T: "x", N: 3})
	if err != nil {
		t.Fatal(err)
	}
	var m msg
	if err := Unmarshal(b, &m); err != nil || m.T != "x" || m.N != 3 {
		t.Fatalf("got %+v %v", m, err)
	}
	if err := Unmarshal([]byte{0xc1}, &m); !errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v, want ErrMalformed", err)
	}
	if !strings.Contains(fmt.Sprint(Unmarshal(nil, &m)), "malformed") {
		t.Fatal("empty input accepted")
	}
}
