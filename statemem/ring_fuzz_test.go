package statemem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzRingBatchScribbled fills a ring, lets the input overwrite its tail
// and head words and bytes of its data area (what any process of the user
// can do to the shared memory), then runs PutMany and GetMany: neither
// panics or reads outside the ring; every error is ErrRingCorrupt; every
// item GetMany returns lies within the inline limit and the budget; and
// when nothing was scribbled, what GetMany returns is what went in.
func FuzzRingBatchScribbled(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 8, 1, 0, 0, 0, 99, 0, 0, 0})
	f.Add([]byte{1, 3, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{2, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Add([]byte{3, 16, 0, 0, 0x10, 0, 1, 0, 0, 0, 0, 16, 0xfc, 0x0f, 0, 0, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 512 {
			return
		}
		r, err := NewRing(4096, 0, 1024)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if r.Lock(noneGone) != nil {
			t.Fatal("lock")
		}
		defer r.Unlock(false)
		var put [][]byte
		for i := 0; i < 20; i++ {
			put = append(put, bytes.Repeat([]byte{byte(i)}, 1+i*13%90))
		}
		if n, err := r.PutMany(RecItem, put[:10]); n != 10 || err != nil {
			t.Fatalf("PutMany into an empty ring: %d, %v", n, err)
		}
		r.Get() // the head moves off index 0
		scribbled := false
		// Each scribble: a selector byte, an offset byte, 8 bytes of value.
		for len(in) >= 10 {
			sel, off, val := in[0]%4, uint64(in[1]), binary.LittleEndian.Uint64(in[2:10])
			in = in[10:]
			scribbled = true
			switch sel {
			case 0:
				r.TestSetWord(RingOffTail, val)
			case 1:
				r.TestSetWord(ringOffHead, val)
			default: // a record header or payload word
				binary.LittleEndian.PutUint64(r.mem[RingHeader+8*off:], val)
			}
		}
		for round := 0; round < 3; round++ {
			if _, err := r.PutMany(RecItem, put[10:]); err != nil && !errors.Is(err, ErrRingCorrupt) {
				t.Fatalf("PutMany: %v", err)
			}
			budget := int64(300 + round*2000)
			got, used, err := r.GetMany(1000, budget, 3)
			if err != nil && !errors.Is(err, ErrRingCorrupt) {
				t.Fatalf("GetMany: %v", err)
			}
			var sum int64
			for _, p := range got {
				if uint64(len(p)) > r.Inline() {
					t.Fatalf("an item of %d bytes, past the inline limit", len(p))
				}
				sum += int64(len(p)) + 3
			}
			if sum != used || used > budget {
				t.Fatalf("GetMany reported %d bytes for %d, budget %d", used, sum, budget)
			}
			if !scribbled && round == 0 {
				want := append(append([][]byte{}, put[1:]...), nil)[:len(got)]
				for i := range got {
					if !bytes.Equal(got[i], want[i]) {
						t.Fatalf("item %d: %v, want %v", i, got[i], want[i])
					}
				}
			}
		}
	})
}
