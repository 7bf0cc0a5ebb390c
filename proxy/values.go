package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/syncmgr/syncmgr/wire"
	"math"
	"reflect"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"
)

// Values: the encoding the Go and Python clients share for what the daemon
// stores as opaque bytes (queue items, object Values, dict keys and values,
// list items, Namespace attributes). See docs/protocol.md, "Values".
//
//	0xC1 msgpack-object   plain data, read and written by both clients
//	anything else         a Python pickle, which Go does not decode
//
// 0xC1 is the one byte msgpack never uses, and no pickle starts with it.

// ValueTag is the first byte of a msgpack-encoded value.
const ValueTag byte = 0xC1

// Pickle is a value Python stored as a pickle: Go cannot decode it, but can
// pass it on unchanged (put it back into a Queue, a Dict, ...).
type Pickle []byte

// ErrPickle is returned by the typed getters for a value that is a Python
// pickle rather than plain data.
var ErrPickle = errors.New("syncmgr: the value is a Python pickle, not plain data")

// EncodeValue encodes v for the daemon: a Pickle as it is, anything else as
// ValueTag followed by msgpack (ints in their smallest form, as Python's
// msgpack writes them).
func EncodeValue(v any) ([]byte, error) {
	if p, ok := v.(Pickle); ok {
		return []byte(p), nil
	}
	var buf bytes.Buffer
	buf.WriteByte(ValueTag)
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("syncmgr: encode value: %w", err)
	}
	return buf.Bytes(), nil
}

// DecodeValue decodes a stored value: plain data as nil, bool, int64 (uint64
// above the int64 range), float64, string, []byte, []any, and map[string]any
// (map[any]any when a key is not a string); a pickle as Pickle.
func DecodeValue(b []byte) (any, error) {
	if len(b) == 0 || b[0] != ValueTag {
		return Pickle(b), nil
	}
	if err := wire.CheckSizes(b[1:]); err != nil {
		return nil, fmt.Errorf("syncmgr: decode value: %w", err)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(b[1:]))
	dec.SetMapDecoder(decodeMap)
	v, err := dec.DecodeInterface()
	if err != nil {
		return nil, fmt.Errorf("syncmgr: decode value: %w", err)
	}
	if _, err := dec.PeekCode(); err == nil {
		return nil, errors.New("syncmgr: decode value: trailing bytes")
	}
	return normValue(v), nil
}

// BytesKey is a map key that Python stored as bytes (a []byte cannot be a Go
// map key; a string key stays a string).
type BytesKey string

// EncodeMsgpack writes the key back as bytes.
func (k BytesKey) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeBytes([]byte(k)) }

// decodeMap decodes a map with scalar keys into map[any]any (normValue then
// makes it a map[string]any when every key is a string).
func decodeMap(d *msgpack.Decoder) (any, error) {
	n, err := d.DecodeMapLen()
	if err != nil || n < 0 {
		return nil, err
	}
	m := make(map[any]any, min(n, 1024))
	for range n {
		k, err := d.DecodeInterface()
		if err != nil {
			return nil, err
		}
		switch kk := k.(type) {
		case []byte:
			k = BytesKey(kk)
		case nil, bool, string, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64:
		default:
			return nil, fmt.Errorf("a map key of type %T is not plain data", k)
		}
		v, err := d.DecodeInterface()
		if err != nil {
			return nil, err
		}
		m[k] = v
	}
	return m, nil
}

// normValue gives decoded numbers one type each (int64, uint64 only above
// the int64 range, float64) and maps string keys where they have them.
func normValue(v any) any {
	switch x := v.(type) {
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x)
		}
		return x
	case float32:
		return float64(x)
	case []any:
		for i := range x {
			x[i] = normValue(x[i])
		}
		return x
	case map[any]any:
		strs := make(map[string]any, len(x))
		for k, e := range x {
			e = normValue(e)
			x[k] = e
			if s, ok := k.(string); ok && strs != nil {
				strs[s] = e
			} else {
				strs = nil
			}
		}
		if strs != nil {
			return strs
		}
		out := make(map[any]any, len(x))
		for k, e := range x {
			out[normValue(k)] = e
		}
		return out
	}
	return v
}

// CanonicalKey is the dict key the daemon compares: equal for keys Python
// considers equal (True, 1 and 1.0 are one key), the same bytes the Python
// client computes. Keys are nil, bools, integers, floats, strings, []byte,
// and slices or arrays of keys (Python tuples).
func CanonicalKey(k any) ([]byte, error) {
	n, err := normKey(reflect.ValueOf(k), 0)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.WriteByte('m')
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(n); err != nil {
		return nil, fmt.Errorf("syncmgr: encode key: %w", err)
	}
	return buf.Bytes(), nil
}

func normKey(v reflect.Value, depth int) (any, error) {
	if !v.IsValid() {
		return nil, nil
	}
	if depth > 32 {
		return nil, errors.New("syncmgr: dict key nested too deeply")
	}
	switch v.Kind() {
	case reflect.Interface, reflect.Pointer:
		if v.IsNil() {
			return nil, nil
		}
		return normKey(v.Elem(), depth)
	case reflect.Bool:
		if v.Bool() {
			return int64(1), nil
		}
		return int64(0), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := v.Uint()
		if u <= math.MaxInt64 {
			return int64(u), nil
		}
		return u, nil
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if math.IsInf(f, 0) || f != math.Trunc(f) { // NaN too
			return f, nil
		}
		switch {
		case f >= -(1<<63) && f < (1<<63):
			return int64(f), nil
		case f >= 0 && f < (1<<64):
			return uint64(f), nil
		default: // Python's int(f) is beyond 64 bits: ext type 1 holding its decimal digits
			return bigIntKey(strconv.FormatFloat(f, 'f', 0, 64)), nil
		}
	case reflect.String:
		return v.String(), nil
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			if v.Kind() == reflect.Slice {
				return v.Bytes(), nil
			}
			b := make([]byte, v.Len())
			reflect.Copy(reflect.ValueOf(b), v)
			return b, nil
		}
		out := make([]any, v.Len())
		for i := range out {
			x, err := normKey(v.Index(i), depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	}
	return nil, fmt.Errorf("syncmgr: a %s cannot be a dict key shared with Python (use nil, bool, numbers, strings, []byte or slices of them)", v.Type())
}

// bigIntKey is an integer key beyond 64 bits, as Python encodes it: msgpack
// ext type 1 holding the integer's decimal digits.
type bigIntKey string

var _ msgpack.CustomEncoder = bigIntKey("")

func (k bigIntKey) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeExtHeader(1, len(k)); err != nil {
		return err
	}
	_, err := enc.Writer().Write([]byte(k))
	return err
}
