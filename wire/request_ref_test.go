package wire

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"math"
	"reflect"
	"strconv"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// decodeRequestMsgpack is the request decoder as the msgpack library
// decodes a request: the reference DecodeRequest is held to.
func decodeRequestMsgpack(body []byte) (Request, error) {
	var req Request
	dec, rd, done, err := envelope(body, "request")
	if err != nil {
		return req, err
	}
	defer done()
	if req.ID, err = refDecodeID(dec); err != nil {
		return req, fmt.Errorf("%w: request id: %v", ErrMalformed, err)
	}
	if req.Op, err = decodeStr(dec); err != nil {
		return req, fmt.Errorf("%w: request op: %v", ErrMalformed, err)
	}
	if req.Args, err = refDecodeArgs(dec, &refFrameSrc{body: body, rd: rd}); err != nil {
		return req, err
	}
	if rd.Len() != 0 {
		return req, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, rd.Len())
	}
	return req, nil
}

// refFrameSrc lets bin values be taken as sub-slices of the frame body instead
// of copies: a 1 MiB queue item is then read from the socket once and never
// copied again in the daemon. The body is allocated per frame and never
// reused, so holding on to a sub-slice is safe.
type refFrameSrc struct {
	body []byte
	rd   *bytes.Reader // the decoder reads straight from it (no buffering)
}

func (f *refFrameSrc) bin(dec *msgpack.Decoder) ([]byte, error) {
	n, err := dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	pos := len(f.body) - f.rd.Len()
	if n < 0 || pos+n > len(f.body) {
		return nil, fmt.Errorf("bin of %d bytes runs past the frame", n)
	}
	if _, err := f.rd.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, err
	}
	return f.body[pos : pos+n : pos+n], nil
}

func refDecodeArgs(dec *msgpack.Decoder, src *refFrameSrc) (Args, error) {
	// The one change from the daemon's former decoder: msgpack's
	// DecodeMapLen also takes an ext-wrapped map (it skips an ext header),
	// which the protocol does not have and no client sends; DecodeRequest
	// refuses it.
	if c, err := dec.PeekCode(); err == nil && msgpcode.IsExt(c) {
		return nil, fmt.Errorf("%w: args must be a map: an ext (code 0x%02x)", ErrMalformed, c)
	}
	n, err := dec.DecodeMapLen()
	if err != nil {
		return nil, fmt.Errorf("%w: args must be a map: %v", ErrMalformed, err)
	}
	if n < 0 || n > MaxArgs {
		return nil, fmt.Errorf("%w: args must be a map of at most %d entries", ErrMalformed, MaxArgs)
	}
	args := make(Args, n)
	for i := 0; i < n; i++ {
		k, err := decodeStr(dec)
		if err != nil {
			return nil, fmt.Errorf("%w: arg key: %v", ErrMalformed, err)
		}
		var v any
		if c, perr := dec.PeekCode(); perr == nil && msgpcode.IsBin(c) && src != nil {
			v, err = src.bin(dec)
		} else {
			v, err = decodeScalar(dec)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: arg %q: %v", ErrMalformed, k, err)
		}
		args[i] = Arg{key: []byte(k), Val: v}
	}
	return args, nil
}

// decodeID decodes a request id: a non-negative integer. (The msgpack
// decoder alone would take nil as 0 and wrap negative numbers around.)
func refDecodeID(dec *msgpack.Decoder) (uint64, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case msgpcode.IsFixedNum(c) && int8(c) >= 0, c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32 || c == msgpcode.Uint64:
		return dec.DecodeUint64()
	case c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64:
		n, err := dec.DecodeInt64()
		if err == nil && n < 0 {
			err = fmt.Errorf("negative id %d", n)
		}
		return uint64(n), err
	default:
		return 0, fmt.Errorf("must be an unsigned integer (code 0x%02x)", c)
	}
}

// DecodeRequest accepts what the msgpack decoder accepts and returns what
// it returns (types included), and its errors are ErrMalformed where the
// decoder's are.
func FuzzDecodeRequestMatchesMsgpack(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add(build(f, s...))
	}
	f.Add([]byte{0x93, 0xd0, 0x05, 0xa1, 'x', 0x82, 0xa1, 'a', 0xca, 0x3f, 0x80, 0, 0, 0xa4, 'n', 'a', 'm', 'e', 0xc4, 0})
	f.Add([]byte{0x93, 0xcc, 0x05, 0xd9, 0x01, 'x', 0xde, 0x00, 0x01, 0xa4, 'k', 'i', 'n', 'd', 0xa4, 'l', 'o', 'c', 'k'})
	f.Add([]byte{0x93, 0x01, 0xa1, 'x', 0xc0})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gerr := DecodeRequest(b)
		want, werr := decodeRequestMsgpack(b)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("DecodeRequest: %v; msgpack: %v", gerr, werr)
		}
		if gerr != nil {
			if !errors.Is(gerr, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", gerr)
			}
			return
		}
		if got.ID != want.ID || got.Op != want.Op || !sameArgs(got.Args, want.Args) {
			t.Fatalf("DecodeRequest %#v; msgpack %#v", got, want)
		}
	})
}

// sameArgs holds two requests' arguments to the same map (a key given
// twice counts once, its last value), by reflect.DeepEqual with floats
// compared by their bits (a NaN is the same NaN).
func sameArgs(aa, bb Args) bool {
	a, b := aa.Map(), bb.Map()
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		y, ok := b[k]
		if !ok {
			return false
		}
		fx, xf := x.(float64)
		fy, yf := y.(float64)
		if xf || yf {
			if !xf || !yf || math.Float64bits(fx) != math.Float64bits(fy) {
				return false
			}
		} else if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// Every name names.go declares is in wireNames.
func TestWireNamesHasEveryName(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "names.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, s := range wireNames {
		have[s] = true
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		spec, ok := node.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for _, v := range spec.Values {
			if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, _ := strconv.Unquote(lit.Value)
				n++
				if !have[s] {
					t.Errorf("%q (%s) is not in wireNames", s, spec.Names[0].Name)
				}
			}
		}
		return true
	})
	if n < 100 {
		t.Fatalf("found %d names in names.go", n)
	}
}

// A Value get's request decodes with four allocations (the map's two and
// the object's name, its bytes and its box as an any), its op, keys and
// kind the package's own strings.
func TestDecodeRequestAllocations(t *testing.T) {
	body := unframe(t)(EncodeRequest(7, OpGet, map[string]any{ArgKind: KindValue, ArgName: "v-0001", ArgTID: int64(12)}))
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := DecodeRequest(body); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 4 {
		t.Fatalf("%.0f allocations per request", allocs)
	}
}

func BenchmarkDecodeRequest(b *testing.B) {
	body, err := EncodeRequest(7, OpGet, map[string]any{ArgKind: KindValue, ArgName: "v-0001", ArgTID: int64(12)})
	if err != nil {
		b.Fatal(err)
	}
	body = body[HeaderSize:]
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = DecodeRequest(body)
		}
	})
	b.Run("msgpack", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = decodeRequestMsgpack(body)
		}
	})
}
