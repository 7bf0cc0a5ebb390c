package wire

import (
	"encoding/binary"
	"fmt"
)

// BinTuples decodes b, a MessagePack array whose elements are bins (k = 1)
// or arrays of exactly k bins (k > 1), into the bins in order (k per
// element). The bins are sub-slices of b, not copies, and the result is
// allocated once: its declared length is checked against the bytes that
// could hold it first, so the cost is proportional to len(b) whatever the
// header claims.
func BinTuples(b []byte, k int) ([][]byte, error) {
	if k < 1 {
		return nil, fmt.Errorf("bad tuple size %d", k)
	}
	n, rest, err := arrayHeader(b)
	if err != nil {
		return nil, err
	}
	minElem := 2 * k // a bin takes at least 2 bytes
	if k > 1 {
		minElem++ // and a tuple's array header 1
	}
	if n > len(rest)/minElem {
		return nil, fmt.Errorf("%d elements declared in %d bytes", n, len(rest))
	}
	// A first pass checks the whole array without allocating, so that a
	// malformed batch costs nothing; the second fills the result.
	if err := walkTuples(rest, n, k, nil); err != nil {
		return nil, err
	}
	out := make([][]byte, 0, n*k)
	if err := walkTuples(rest, n, k, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// walkTuples reads n elements of k bins from b, appending the bins to out
// when it is not nil.
func walkTuples(rest []byte, n, k int, out *[][]byte) error {
	var err error
	for i := 0; i < n; i++ {
		if k > 1 {
			var m int
			if m, rest, err = arrayHeader(rest); err != nil {
				return fmt.Errorf("element %d: %v", i, err)
			}
			if m != k {
				return fmt.Errorf("element %d has %d items, not %d", i, m, k)
			}
		}
		for j := 0; j < k; j++ {
			var v []byte
			if v, rest, err = binValue(rest); err != nil {
				return fmt.Errorf("element %d: %v", i, err)
			}
			if out != nil {
				*out = append(*out, v)
			}
		}
	}
	if len(rest) != 0 {
		return fmt.Errorf("%d trailing bytes", len(rest))
	}
	return nil
}

func arrayHeader(b []byte) (int, []byte, error) {
	if len(b) == 0 {
		return 0, nil, errTruncated
	}
	c := b[0]
	switch {
	case c >= 0x90 && c <= 0x9f:
		return int(c & 0x0f), b[1:], nil
	case c == 0xdc && len(b) >= 3:
		return int(binary.BigEndian.Uint16(b[1:])), b[3:], nil
	case c == 0xdd && len(b) >= 5:
		n := binary.BigEndian.Uint32(b[1:])
		if uint64(n) > uint64(len(b)) {
			return 0, nil, errTruncated
		}
		return int(n), b[5:], nil
	case c == 0xdc || c == 0xdd:
		return 0, nil, errTruncated
	default:
		return 0, nil, fmt.Errorf("expected an array (code 0x%02x)", c)
	}
}

// binValue returns the bin at the start of b, as a sub-slice with its
// capacity cut to its length (an append to it cannot touch b), and the rest.
func binValue(b []byte) ([]byte, []byte, error) {
	if len(b) == 0 {
		return nil, nil, errTruncated
	}
	var n, h int
	switch b[0] {
	case 0xc4:
		if len(b) < 2 {
			return nil, nil, errTruncated
		}
		n, h = int(b[1]), 2
	case 0xc5:
		if len(b) < 3 {
			return nil, nil, errTruncated
		}
		n, h = int(binary.BigEndian.Uint16(b[1:])), 3
	case 0xc6:
		if len(b) < 5 {
			return nil, nil, errTruncated
		}
		u := binary.BigEndian.Uint32(b[1:])
		if uint64(u) > uint64(len(b)) {
			return nil, nil, errTruncated
		}
		n, h = int(u), 5
	default:
		return nil, nil, fmt.Errorf("expected a bin (code 0x%02x)", b[0])
	}
	if n > len(b)-h {
		return nil, nil, errTruncated
	}
	return b[h : h+n : h+n], b[h+n:], nil
}

// ArrayLen returns the element count a MessagePack array declares, without
// decoding it.
func ArrayLen(b []byte) (int, error) {
	n, _, err := arrayHeader(b)
	return n, err
}
