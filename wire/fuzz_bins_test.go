package wire

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzBinTuples feeds put_many's items argument (and every other batch's):
// BinTuples never panics, never returns a bin outside its input, and what
// it accepts with k = 1 is exactly the MessagePack array of bins that
// re-encodes to the same items.
func FuzzBinTuples(f *testing.F) {
	for _, items := range [][][]byte{nil, {{}}, {[]byte("a"), []byte("bc")}, {bytes.Repeat([]byte("x"), 300)}} {
		b, err := msgpack.Marshal(items)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, 1)
	}
	f.Add([]byte{0x92, 0x92, 0xc4, 0x01, 'k', 0xc4, 0x01, 'v', 0x92, 0xc4, 0x00, 0xc4, 0x00}, 2)
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, 1)
	f.Add([]byte{0x91, 0xc6, 0xff, 0xff, 0xff, 0xf0}, 1)
	f.Fuzz(func(t *testing.T, b []byte, k int) {
		if k < 1 || k > 4 {
			return
		}
		out, err := BinTuples(b, k)
		if err != nil {
			return
		}
		if len(out)%k != 0 {
			t.Fatalf("%d bins for tuples of %d", len(out), k)
		}
		for _, v := range out {
			if len(v) > len(b) {
				t.Fatalf("a bin of %d bytes from %d bytes of input", len(v), len(b))
			}
		}
		if k == 1 {
			again, err := msgpack.Marshal(out)
			if err != nil {
				t.Fatal(err)
			}
			back, err := BinTuples(again, 1)
			if err != nil || len(back) != len(out) {
				t.Fatalf("re-encoded batch: %d items, %v; want %d", len(back), err, len(out))
			}
			for i := range out {
				if !bytes.Equal(back[i], out[i]) {
					t.Fatalf("item %d changed in the round trip", i)
				}
			}
		}
	})
}
