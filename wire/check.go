package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

var errTruncated = errors.New("truncated value")

// checkSizes walks the one MessagePack value that b must hold, without
// decoding or allocating, and checks that every str, bin, ext, array and map
// length it declares fits in the bytes that follow, and that nothing follows
// the value.
//
// The msgpack decoder allocates a str or bin of the declared length before
// it reads the bytes, so without this check a 20-byte message claiming a
// 4 GiB bin costs 4 GiB, before the handshake as well as after it. The walk
// keeps a count of values still to come instead of recursing, so nesting
// costs nothing either.
func checkSizes(b []byte) error {
	pending := 1 // values still to read
	for pending > 0 {
		if pending > len(b) { // every value takes at least one byte
			return errTruncated
		}
		c := b[0]
		b = b[1:]
		pending--
		var lenSize int  // size of a big-endian length that follows c
		var skip uint64  // payload bytes to skip
		var items uint64 // values each length unit stands for (1 array, 2 map)
		extra := uint64(0)
		switch {
		case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixint, nil, false, true
		case c >= 0x80 && c <= 0x8f: // fixmap
			pending += 2 * int(c&0x0f)
		case c >= 0x90 && c <= 0x9f: // fixarray
			pending += int(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf: // fixstr
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			lenSize = 1
		case c == 0xc5 || c == 0xda: // bin16, str16
			lenSize = 2
		case c == 0xc6 || c == 0xdb: // bin32, str32
			lenSize = 4
		case c == 0xc7: // ext8: length, type, data
			lenSize, extra = 1, 1
		case c == 0xc8: // ext16
			lenSize, extra = 2, 1
		case c == 0xc9: // ext32
			lenSize, extra = 4, 1
		case c == 0xca: // float32
			skip = 4
		case c == 0xcb: // float64
			skip = 8
		case c >= 0xcc && c <= 0xcf: // uint8..uint64
			skip = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3: // int8..int64
			skip = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8: // fixext 1..16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc: // array16
			lenSize, items = 2, 1
		case c == 0xdd: // array32
			lenSize, items = 4, 1
		case c == 0xde: // map16
			lenSize, items = 2, 2
		case c == 0xdf: // map32
			lenSize, items = 4, 2
		default: // 0xc1, never used
			return fmt.Errorf("reserved code 0x%02x", c)
		}
		if lenSize > 0 {
			if len(b) < lenSize {
				return errTruncated
			}
			var n uint64
			switch lenSize {
			case 1:
				n = uint64(b[0])
			case 2:
				n = uint64(binary.BigEndian.Uint16(b))
			case 4:
				n = uint64(binary.BigEndian.Uint32(b))
			}
			b = b[lenSize:]
			if items > 0 {
				if n*items > uint64(len(b)) {
					return fmt.Errorf("%w: %d elements declared, %d bytes left", errTruncated, n*items, len(b))
				}
				pending += int(n * items)
			} else {
				skip = n + extra
			}
		}
		if skip > uint64(len(b)) {
			return fmt.Errorf("%w: %d bytes declared, %d left", errTruncated, skip, len(b))
		}
		b = b[skip:]
	}
	if len(b) != 0 {
		return fmt.Errorf("%d trailing bytes", len(b))
	}
	return nil
}

// CheckSizes is checkSizes for other packages that decode MessagePack from
// a peer (the Go client's cross-language values): every declared length
// must fit in b, so a short input cannot make the decoder allocate gigabytes.
func CheckSizes(b []byte) error { return checkSizes(b) }
