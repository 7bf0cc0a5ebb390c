package wire

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DecodeRequest parses a request body: a 3-element array of a non-negative
// integer id, a str op and a map of str keys to scalars. Any error wraps
// ErrMalformed.
//
// It reads the body's bytes directly rather than through the msgpack
// decoder, which the replies and the handshake keep: a request is decoded
// for every op the daemon serves, and the decoder's reader, its pooled
// state and a fresh string for every key cost more than the op itself for
// the socket path's cheapest ops. Ops and string values that are wire
// names (names.go) are the package's own strings, not copies; keys and
// bins are sub-slices of the body, and the arguments a slice (Args). What it accepts and returns is the msgpack
// decoder's (the tests hold it to that decoder, fuzzed).
func DecodeRequest(body []byte) (Request, error) {
	var req Request
	if err := checkSizes(body); err != nil { // (every length below then fits, and nothing trails)
		return req, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	r := reader{b: body}
	var err error
	if req.ID, err = r.requestID(); err != nil {
		return req, err
	}
	op, err := r.str()
	if err != nil {
		return req, fmt.Errorf("%w: request op: %v", ErrMalformed, err)
	}
	req.Op = intern(op)
	if req.Args, err = r.args(); err != nil {
		return req, err
	}
	if r.i != len(body) {
		return req, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(body)-r.i)
	}
	return req, nil
}

// MaxIDPrefix is how many bytes of a request body PeekRequestID needs: the
// array header (at most 5 bytes) and the largest id (9 bytes).
const MaxIDPrefix = 14

// PeekRequestID reads the request id from the first bytes of a request
// body (at most MaxIDPrefix), without the rest: the daemon answers a frame
// it will not read (too large) under the id the client is waiting on.
func PeekRequestID(prefix []byte) (uint64, error) {
	if len(prefix) == 0 {
		return 0, fmt.Errorf("%w: empty request", ErrMalformed)
	}
	r := reader{b: prefix}
	return r.requestID()
}

// requestID reads a request's array header and its id, the first bytes
// of every request (errors wrap ErrMalformed).
func (r *reader) requestID() (uint64, error) {
	if n, err := r.arrayLen(); err != nil || n != 3 {
		return 0, fmt.Errorf("%w: request must be a 3-element array", ErrMalformed)
	}
	id, err := r.id()
	if err != nil {
		return 0, fmt.Errorf("%w: request id: %v", ErrMalformed, err)
	}
	return id, nil
}

// reader reads MessagePack values from b at i. Every read checks that its
// bytes are there: PeekRequestID reads a prefix that checkSizes has not
// seen.
type reader struct {
	b []byte
	i int
}

func (r *reader) next() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.i]
	r.i++
	return c, nil
}

// take returns the next n bytes, a sub-slice of b that cannot be appended
// into what follows it.
func (r *reader) take(n uint64) ([]byte, error) {
	if n > uint64(len(r.b)-r.i) {
		return nil, errTruncated
	}
	s := r.b[r.i : r.i+int(n) : r.i+int(n)]
	r.i += int(n)
	return s, nil
}

// be reads a big-endian unsigned integer of size bytes (1, 2, 4 or 8).
func (r *reader) be(size int) (uint64, error) {
	p, err := r.take(uint64(size))
	if err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	}
	return binary.BigEndian.Uint64(p), nil
}

// signed reads a big-endian two's-complement integer of size bytes.
func (r *reader) signed(size int) (int64, error) {
	u, err := r.be(size)
	shift := 64 - 8*size
	return int64(u<<shift) >> shift, err
}

// arrayLen reads an array header (-1 for nil, which no request is).
func (r *reader) arrayLen() (int, error) {
	c, err := r.next()
	switch {
	case err != nil:
		return 0, err
	case c >= 0x90 && c <= 0x9f:
		return int(c & 0x0f), nil
	case c == 0xdc:
		n, err := r.be(2)
		return int(n), err
	case c == 0xdd:
		n, err := r.be(4)
		return int(n), err
	case c == 0xc0:
		return -1, nil
	}
	return 0, fmt.Errorf("not an array (code 0x%02x)", c)
}

// id reads a request id: a non-negative integer of any width. (nil, a
// negative number and any other type are refused, as the msgpack
// reference in the tests, refDecodeID, refuses them.)
func (r *reader) id() (uint64, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.i]
	switch {
	case c <= 0x7f:
		r.i++
		return uint64(c), nil
	case c >= 0xcc && c <= 0xcf: // uint8 .. uint64
		r.i++
		return r.be(1 << (c - 0xcc))
	case c >= 0xd0 && c <= 0xd3: // int8 .. int64
		r.i++
		n, err := r.signed(1 << (c - 0xd0))
		if err == nil && n < 0 {
			err = fmt.Errorf("negative id %d", n)
		}
		return uint64(n), err
	}
	return 0, fmt.Errorf("must be an unsigned integer (code 0x%02x)", c)
}

// str reads a str (not a bin, not nil) and returns its bytes.
func (r *reader) str() ([]byte, error) {
	if r.i >= len(r.b) {
		return nil, errTruncated
	}
	c := r.b[r.i]
	var n uint64
	var err error
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.i++
		n = uint64(c & 0x1f)
	case c >= 0xd9 && c <= 0xdb: // str8, str16, str32
		r.i++
		n, err = r.be(1 << (c - 0xd9))
	default:
		return nil, fmt.Errorf("must be a str (code 0x%02x)", c)
	}
	if err != nil {
		return nil, err
	}
	return r.take(n)
}

// args reads the arguments map: str keys, scalar values, at most MaxArgs.
func (r *reader) args() (Args, error) {
	c, err := r.next()
	var n uint64
	switch {
	case err != nil:
	case c >= 0x80 && c <= 0x8f:
		n = uint64(c & 0x0f)
	case c == 0xde:
		n, err = r.be(2)
	case c == 0xdf:
		n, err = r.be(4)
	case c == 0xc0:
		return nil, fmt.Errorf("%w: args must be a map of at most %d entries", ErrMalformed, MaxArgs)
	default:
		err = fmt.Errorf("not a map (code 0x%02x)", c)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: args must be a map: %v", ErrMalformed, err)
	}
	if n > MaxArgs {
		return nil, fmt.Errorf("%w: args must be a map of at most %d entries", ErrMalformed, MaxArgs)
	}
	args := make(Args, n)
	for i := range args {
		k, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("%w: arg key: %v", ErrMalformed, err)
		}
		v, err := r.scalar()
		if err != nil {
			return nil, fmt.Errorf("%w: arg %q: %v", ErrMalformed, k, err)
		}
		args[i] = Arg{key: k, Val: v}
	}
	return args, nil
}

// scalar reads one argument value: nil, bool, int64 (any signed or
// positive fixed integer), uint64 (the unsigned codes), float64, string or
// []byte (a sub-slice of the body: a 1 MiB queue item is read from the
// socket once and never copied in the daemon; the body is allocated per
// frame and never reused, so holding on to it is safe).
func (r *reader) scalar() (any, error) {
	if r.i >= len(r.b) {
		return nil, errTruncated
	}
	c := r.b[r.i]
	switch {
	case c == 0xc0:
		r.i++
		return nil, nil
	case c == 0xc2 || c == 0xc3:
		r.i++
		return c == 0xc3, nil
	case c <= 0x7f || c >= 0xe0:
		r.i++
		return int64(int8(c)), nil
	case c >= 0xd0 && c <= 0xd3:
		r.i++
		return r.signed(1 << (c - 0xd0))
	case c >= 0xcc && c <= 0xcf:
		r.i++
		return r.be(1 << (c - 0xcc))
	case c == 0xca:
		r.i++
		u, err := r.be(4)
		return float64(math.Float32frombits(uint32(u))), err
	case c == 0xcb:
		r.i++
		u, err := r.be(8)
		return math.Float64frombits(u), err
	case c >= 0xa0 && c <= 0xbf || c >= 0xd9 && c <= 0xdb:
		s, err := r.str()
		if err != nil {
			return nil, err
		}
		if v, ok := internedValues[string(s)]; ok {
			return v, nil
		}
		return string(s), nil
	case c >= 0xc4 && c <= 0xc6: // bin8, bin16, bin32
		r.i++
		n, err := r.be(1 << (c - 0xc4))
		if err != nil {
			return nil, err
		}
		return r.take(n)
	}
	return nil, fmt.Errorf("only nil, bool, int, float, str and bin are allowed (code 0x%02x)", c)
}

// intern returns the package's own string for a wire name (names.go), and
// a copy of b for any other: a request's op.
func intern(b []byte) string {
	if s, ok := interned[string(b)]; ok {
		return s
	}
	return string(b)
}

var (
	interned       = make(map[string]string, len(wireNames))
	internedValues = make(map[string]any, len(wireNames)) // boxed once: an any of a string allocates
)

func init() {
	for _, s := range wireNames {
		interned[s] = s
		internedValues[s] = s
	}
}
