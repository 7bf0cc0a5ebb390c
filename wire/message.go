package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Request is a decoded request frame: [id, op, args].
type Request struct {
	ID   uint64
	Op   string
	Args Args
}

// Args are a request's arguments, in the order its frame gave them. Values
// are scalars only: nil, bool, int64, uint64, float64, string or []byte.
// Keeping them flat means a hostile frame cannot make the decoder recurse.
//
// They are a slice, not a map: a request carries a handful, which a scan
// finds sooner than a hash does, and a map cost the decoder two
// allocations and a hash per key on every request the daemon serves. A key
// given twice counts as a map's would: the last one given.
type Args []Arg

// Arg is one argument: its key, as the frame spelled it (a sub-slice of the
// request's body, read only), and its value.
type Arg struct {
	key []byte
	Val any
}

// ArgsOf returns m's entries as Args, in the order of their keys: requests
// the daemon did not decode (its tests, a client's own).
func ArgsOf(m map[string]any) Args {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	a := make(Args, 0, len(m))
	for _, k := range keys {
		a = append(a, Arg{key: []byte(k), Val: m[k]})
	}
	return a
}

// Lookup returns the value of key and whether the request gave it.
func (a Args) Lookup(key string) (any, bool) {
	for i := len(a) - 1; i >= 0; i-- {
		if string(a[i].key) == key {
			return a[i].Val, true
		}
	}
	return nil, false
}

// Get returns the value of key, or nil when the request did not give it.
func (a Args) Get(key string) any {
	v, _ := a.Lookup(key)
	return v
}

// Map returns the arguments as a map (a key given twice: the last value).
func (a Args) Map() map[string]any {
	m := make(map[string]any, len(a))
	for _, x := range a {
		m[string(x.key)] = x.Val
	}
	return m
}

// MaxArgs is the largest number of arguments a request may carry.
const MaxArgs = 64

var decoderPool = sync.Pool{New: func() any { return msgpack.NewDecoder(nil) }}

// envelope checks a body's declared sizes and opens its 3-element array.
// The caller calls done when it has finished with dec.
func envelope(body []byte, what string) (dec *msgpack.Decoder, rd *bytes.Reader, done func(), err error) {
	if err := checkSizes(body); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	rd = bytes.NewReader(body)
	dec = decoderPool.Get().(*msgpack.Decoder)
	dec.Reset(rd)
	done = func() { decoderPool.Put(dec) }
	if n, err := dec.DecodeArrayLen(); err != nil || n != 3 {
		done()
		return nil, nil, nil, fmt.Errorf("%w: %s must be a 3-element array", ErrMalformed, what)
	}
	return dec, rd, done, nil
}

// decodeStr decodes a MessagePack str, refusing bin and nil, which the
// msgpack decoder alone would take as strings.
func decodeStr(dec *msgpack.Decoder) (string, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("must be a str (code 0x%02x)", c)
	}
	return dec.DecodeString()
}

func decodeScalar(dec *msgpack.Decoder) (any, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, dec.DecodeNil()
	case c == msgpcode.True || c == msgpcode.False:
		return dec.DecodeBool()
	case msgpcode.IsFixedNum(c) || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64:
		return dec.DecodeInt64()
	case c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32 || c == msgpcode.Uint64:
		return dec.DecodeUint64()
	case c == msgpcode.Float || c == msgpcode.Double:
		return dec.DecodeFloat64()
	case msgpcode.IsString(c):
		return dec.DecodeString()
	case msgpcode.IsBin(c):
		return dec.DecodeBytes()
	default:
		return nil, fmt.Errorf("only nil, bool, int, float, str and bin are allowed (code 0x%02x)", c)
	}
}

// EncodeRequest builds a framed request (header included, ready to write).
func EncodeRequest(id uint64, op string, args map[string]any) ([]byte, error) {
	return encode(func(enc *msgpack.Encoder) error {
		if err := enc.EncodeArrayLen(3); err != nil {
			return err
		}
		if err := enc.EncodeUint(id); err != nil {
			return err
		}
		if err := enc.EncodeString(op); err != nil {
			return err
		}
		if args == nil {
			return enc.EncodeMapLen(0)
		}
		return enc.Encode(args)
	})
}

// EncodeReply builds a framed reply [id, error, result] (header included).
func EncodeReply(id uint64, e *Error, result any) ([]byte, error) {
	return encode(func(enc *msgpack.Encoder) error {
		if err := enc.EncodeArrayLen(3); err != nil {
			return err
		}
		if err := enc.EncodeUint(id); err != nil {
			return err
		}
		if e == nil {
			if err := enc.EncodeNil(); err != nil {
				return err
			}
			if items, ok := result.([][]byte); ok {
				return encodeBins(enc, items)
			}
			return enc.Encode(result)
		}
		if err := enc.EncodeArrayLen(2); err != nil {
			return err
		}
		if err := enc.EncodeString(string(e.Code)); err != nil {
			return err
		}
		if err := enc.EncodeString(e.Message); err != nil {
			return err
		}
		return enc.EncodeNil()
	})
}

// encodeBins encodes items as an array of bins, as msgpack's Encode
// would, without its reflection: a get_many of 64 items cost 4.4 µs to
// encode through Encode, most of it per item.
func encodeBins(enc *msgpack.Encoder, items [][]byte) error {
	if err := enc.EncodeArrayLen(len(items)); err != nil {
		return err
	}
	for _, it := range items {
		if err := enc.EncodeBytes(it); err != nil {
			return err
		}
	}
	return nil
}

// EncodeBinReplyHead builds the frame header and the start of a successful
// reply whose result is a bin of n bytes; the n bytes follow it on the wire.
// Writing the two with one writev spares copying a large item into the frame.
func EncodeBinReplyHead(id uint64, n int) ([]byte, error) {
	head, err := encode(func(enc *msgpack.Encoder) error {
		if err := encodeOKHead(enc, id); err != nil {
			return err
		}
		return enc.EncodeBytesLen(n)
	})
	if err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(head, uint32(len(head)-HeaderSize+n))
	return head, nil
}

// Reply is a decoded reply frame.
type Reply struct {
	ID     uint64
	Err    *Error
	Result any
}

// DecodeReply parses a reply body. Any error wraps ErrMalformed.
func DecodeReply(body []byte) (Reply, error) {
	var rep Reply
	dec, _, done, err := envelope(body, "reply")
	if err != nil {
		return rep, err
	}
	defer done()
	if rep.ID, err = dec.DecodeUint64(); err != nil {
		return rep, fmt.Errorf("%w: reply id: %v", ErrMalformed, err)
	}
	en, err := dec.DecodeArrayLen()
	if err != nil {
		return rep, fmt.Errorf("%w: reply error: %v", ErrMalformed, err)
	}
	if en == 2 {
		code, err1 := dec.DecodeString()
		msg, err2 := dec.DecodeString()
		if err1 != nil || err2 != nil {
			return rep, fmt.Errorf("%w: reply error must be [code, message]", ErrMalformed)
		}
		rep.Err = &Error{Code: Code(code), Message: msg}
	} else if en != -1 {
		return rep, fmt.Errorf("%w: reply error must be nil or [code, message]", ErrMalformed)
	}
	if rep.Result, err = decodeValue(dec, 0); err != nil {
		return rep, fmt.Errorf("%w: reply result: %v", ErrMalformed, err)
	}
	return rep, nil
}

// maxDepth bounds the nesting of a decoded reply result.
const maxDepth = 32

// decodeValue decodes any value with fixed Go types: int64 (uint64 above
// MaxInt64), float64, bool, string for str, []byte for bin, []any and
// map[string]any, nesting at most maxDepth deep.
func decodeValue(dec *msgpack.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxDepth)
	}
	c, err := dec.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Uint64:
		u, err := dec.DecodeUint64()
		if err != nil || u <= math.MaxInt64 {
			return int64(u), err
		}
		return u, nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		out := make([]any, 0, min(n, 1024))
		for i := 0; i < n; i++ {
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := dec.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		out := make(map[string]any, min(n, 1024))
		for i := 0; i < n; i++ {
			k, err := decodeStr(dec)
			if err != nil {
				return nil, err
			}
			if out[k], err = decodeValue(dec, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	case msgpcode.IsFixedNum(c) || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64 ||
		c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32:
		return dec.DecodeInt64()
	default:
		return decodeScalar(dec)
	}
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

var encoderPool = sync.Pool{New: func() any {
	enc := msgpack.NewEncoder(nil)
	enc.SetSortMapKeys(false)
	return enc
}}

// encode runs fn on a pooled encoder and returns a fresh framed copy.
func encode(fn func(*msgpack.Encoder) error) ([]byte, error) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	buf.Write(make([]byte, HeaderSize))
	enc := encoderPool.Get().(*msgpack.Encoder)
	enc.Reset(buf)
	err := fn(enc)
	encoderPool.Put(enc)
	if err != nil {
		bufPool.Put(buf)
		return nil, err
	}
	out := make([]byte, buf.Len())
	copy(out, buf.Bytes())
	if buf.Cap() <= 1<<20 {
		bufPool.Put(buf)
	}
	return Framed(out), nil
}

// Marshal encodes v as one MessagePack value (used for handshake messages).
func Marshal(v any) ([]byte, error) { return msgpack.Marshal(v) }

// Unmarshal decodes one MessagePack value into v. Declared lengths are
// checked against b first, so a hostile message cannot make the decoder
// allocate more than a small multiple of len(b).
func Unmarshal(b []byte, v any) error {
	if err := checkSizes(b); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := msgpack.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

// Arg accessors. Each returns a *Error with CodeBadRequest when the argument
// has the wrong type, so handlers can return it as is.

// String returns a required string argument.
func (a Args) String(key string) (string, error) {
	switch v := a.Get(key).(type) {
	case string:
		return v, nil
	case nil:
		return "", Errorf(CodeBadRequest, "missing argument %q", key)
	default:
		return "", Errorf(CodeBadRequest, "argument %q must be a string", key)
	}
}

// OptString returns a string argument or "" when absent or nil.
func (a Args) OptString(key string) (string, error) {
	if a.Get(key) == nil {
		return "", nil
	}
	return a.String(key)
}

// Bytes returns a required bin argument.
func (a Args) Bytes(key string) ([]byte, error) {
	switch v := a.Get(key).(type) {
	case []byte:
		return v, nil
	case nil:
		return nil, Errorf(CodeBadRequest, "missing argument %q", key)
	default:
		return nil, Errorf(CodeBadRequest, "argument %q must be bin", key)
	}
}

// Bool returns a bool argument, or def when absent or nil.
func (a Args) Bool(key string, def bool) (bool, error) {
	switch v := a.Get(key).(type) {
	case bool:
		return v, nil
	case nil:
		return def, nil
	default:
		return false, Errorf(CodeBadRequest, "argument %q must be a bool", key)
	}
}

// Int returns an integer argument, or def when absent or nil.
func (a Args) Int(key string, def int64) (int64, error) {
	switch v := a.Get(key).(type) {
	case int64:
		return v, nil
	case uint64:
		if v > math.MaxInt64 {
			return 0, Errorf(CodeValueError, "argument %q out of range", key)
		}
		return int64(v), nil
	case nil:
		return def, nil
	default:
		return 0, Errorf(CodeBadRequest, "argument %q must be an integer", key)
	}
}

// Uint returns an unsigned integer argument, or def when absent or nil.
func (a Args) Uint(key string, def uint64) (uint64, error) {
	switch v := a.Get(key).(type) {
	case uint64:
		return v, nil
	case int64:
		if v < 0 {
			return 0, Errorf(CodeValueError, "argument %q must not be negative", key)
		}
		return uint64(v), nil
	case nil:
		return def, nil
	default:
		return 0, Errorf(CodeBadRequest, "argument %q must be an integer", key)
	}
}

// Timeout returns the "timeout" argument in seconds; ok is false when it is
// absent or nil (wait forever). Negative, NaN and infinite values are a
// value_error.
func (a Args) Timeout() (secs float64, ok bool, err error) {
	switch v := a.Get(ArgTimeout).(type) {
	case nil:
		return 0, false, nil
	case int64:
		secs = float64(v)
	case uint64:
		secs = float64(v)
	case float64:
		secs = v
	default:
		return 0, false, Errorf(CodeBadRequest, "argument \"timeout\" must be a number or nil")
	}
	if math.IsNaN(secs) || math.IsInf(secs, 0) || secs < 0 {
		return 0, false, Errorf(CodeValueError, "timeout must be a finite number >= 0, got %v", secs)
	}
	return secs, true, nil
}

// encodeOKHead writes the start of a successful reply, [id, nil, result],
// up to its result.
func encodeOKHead(enc *msgpack.Encoder, id uint64) error {
	if err := enc.EncodeArrayLen(3); err != nil {
		return err
	}
	if err := enc.EncodeUint(id); err != nil {
		return err
	}
	return enc.EncodeNil()
}

// binPieceMin is the size from which EncodeBinsReply writes an item as a
// piece of its own instead of copying it beside its neighbours.
const binPieceMin = 4 << 10

// EncodeBinsReply lays out a successful reply whose result is a list of
// bins (a get_many's items) as pieces for one writev: the frame header and
// envelope, then every item with its bin header before it. Items of
// binPieceMin bytes or more are pieces of their own, not copied; smaller
// ones, and every bin header, are copied into shared pieces between them.
// The bytes on the wire are exactly those of EncodeReply(id, nil, items).
func EncodeBinsReply(id uint64, items [][]byte) ([][]byte, error) {
	head, err := encode(func(enc *msgpack.Encoder) error {
		if err := encodeOKHead(enc, id); err != nil {
			return err
		}
		return enc.EncodeArrayLen(len(items))
	})
	if err != nil {
		return nil, err
	}
	small, pieces := 0, 1
	for _, it := range items {
		if len(it) < binPieceMin {
			small += len(it)
		} else {
			pieces += 2
		}
	}
	// One backing array for every copied byte: no append below reallocates
	// it, so the pieces cut from it stay valid.
	buf := make([]byte, 0, small+5*len(items))
	out := make([][]byte, 0, pieces+1)
	out = append(out, head)
	total, from := len(head)-HeaderSize, 0
	for _, it := range items {
		buf = appendBinHeader(buf, len(it))
		if len(it) < binPieceMin {
			buf = append(buf, it...)
			continue
		}
		total += len(it)
		out = append(out, buf[from:len(buf):len(buf)], it)
		from = len(buf)
	}
	if from < len(buf) {
		out = append(out, buf[from:])
	}
	total += len(buf)
	if uint64(total) > math.MaxUint32 {
		return nil, fmt.Errorf("%w: a reply of %d bytes", ErrFrameTooLarge, total)
	}
	binary.BigEndian.PutUint32(head, uint32(total))
	return out, nil
}

// appendBinHeader appends the MessagePack header of a bin of n bytes.
func appendBinHeader(b []byte, n int) []byte {
	switch {
	case n < 1<<8:
		return append(b, 0xc4, byte(n))
	case n < 1<<16:
		return append(b, 0xc5, byte(n>>8), byte(n))
	default:
		return append(b, 0xc6, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
}
