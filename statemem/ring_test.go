package statemem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"unsafe"
)

func newTestRing(t *testing.T, maxsize uint64) *Ring {
	t.Helper()
	r, err := NewRing(4096, maxsize, 4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if r.Inline() != 1024 {
		t.Fatalf("inline %d, want a quarter of the capacity", r.Inline())
	}
	return r
}

// Records never wrap: a pad record fills the end of the area, and the
// positions and counts stay right over many laps.
func TestRingWrapsWithPadRecords(t *testing.T) {
	r := newTestRing(t, 0)
	if r.Lock(func(uint32) bool { return false }) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(true)
	next, want := 0, 0
	for lap := 0; lap < 200; lap++ {
		for {
			p := bytes.Repeat([]byte{byte(next)}, 1+next%300)
			ok, err := r.Fits(uint64(len(p)))
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			r.Put(RecItem, p)
			next++
		}
		for i := 0; i < 3; i++ {
			kind, p, ok, err := r.Get()
			if err != nil || !ok || kind != RecItem || len(p) != 1+want%300 || p[0] != byte(want) {
				t.Fatalf("lap %d: got kind %d %d bytes %v %v, want item %d", lap, kind, len(p), ok, err, want)
			}
			want++
		}
	}
	items, used, err := r.Len()
	if err != nil || int(items) != next-want || used > r.Capacity() {
		t.Fatalf("len %d items %d bytes %v, want %d items", items, used, err, next-want)
	}
}

// Impossible words are reported, never followed.
func TestRingChecksWhatItReads(t *testing.T) {
	for name, scribble := range map[string]func(r *Ring){
		"tail past capacity": func(r *Ring) { r.TestSetWord(RingOffTail, 1<<20|1<<40) },
		"misaligned tail":    func(r *Ring) { r.TestSetWord(RingOffTail, 3|1<<40) },
		"more items than fit": func(r *Ring) {
			r.TestSetWord(RingOffTail, 16|1000<<40)
		},
		"record past the area": func(r *Ring) {
			binary.LittleEndian.PutUint32(r.mem[RingHeader:], 1<<30) // the head record's length
		},
		"unknown kind": func(r *Ring) { binary.LittleEndian.PutUint32(r.mem[RingHeader+4:], 99) },
	} {
		t.Run(name, func(t *testing.T) {
			r := newTestRing(t, 0)
			r.Lock(func(uint32) bool { return false })
			defer r.Unlock(false)
			r.Put(RecItem, []byte("x"))
			scribble(r)
			if _, _, _, err := r.Get(); !errors.Is(err, ErrRingCorrupt) {
				t.Fatalf("get: %v, want ErrRingCorrupt", err)
			}
		})
	}
}

// A dead session's latch and sleepers are let go of; the others' stay.
func TestRingReleaseLatch(t *testing.T) {
	r := newTestRing(t, 0)
	r.TestSetWord(RingOffLatch, 7)
	atomic.StoreUint32(r.slotWaiters(7), 2)
	atomic.StoreUint32(r.slotWaiters(9), 1)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.mem[ringOffWaiters])), 3)
	if len(r.Waiters()) != 2 || r.Waiting() != 3 {
		t.Fatalf("waiters %v", r.Waiters())
	}
	seq := r.Seq()
	if r.ReleaseLatch(9) {
		t.Fatal("slot 9 did not hold the latch")
	}
	if !r.ReleaseLatch(7) {
		t.Fatal("slot 7 held the latch")
	}
	if atomic.LoadUint64(r.word(ringOffLatch)) != 0 || r.Waiting() != 0 || r.Seq() == seq {
		t.Fatalf("latch %d waiting %d", atomic.LoadUint64(r.word(ringOffLatch)), r.Waiting())
	}
	if n := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.mem[ringOffWaiters]))); n != 0 {
		t.Fatalf("total sleepers %d, want 0 (3 less the 2 of slot 7 less slot 9's 1)", n)
	}
}

// Head shows the record Get would remove, across a pad record too, and
// leaves it in the ring.
func TestRingHeadLeavesTheRecord(t *testing.T) {
	r := newTestRing(t, 0)
	if r.Lock(func(uint32) bool { return false }) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(true)
	if _, _, ok, err := r.Head(); ok || err != nil {
		t.Fatalf("an empty ring's head: %v %v", ok, err)
	}
	pads := 0
	for i := 0; i < 40; i++ { // sizes that leave a pad record at the area's end
		p := bytes.Repeat([]byte{byte(i)}, 100+i*7)
		for {
			ok, err := r.Fits(uint64(len(p)))
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
			if _, _, _, err := r.Get(); err != nil {
				t.Fatal(err)
			}
		}
		r.Put(RecItem, p)
		for {
			hk, hp, ok, err := r.Head()
			if err != nil || !ok {
				t.Fatalf("head: %v %v", ok, err)
			}
			items, _, _ := r.Len()
			head := append([]byte(nil), hp...)
			before, _ := r.head()
			kind, got, ok, err := r.Get()
			if after, _ := r.head(); after-before > recHeader+pad8(uint64(len(got))) {
				pads++
			}
			if err != nil || !ok || kind != hk || !bytes.Equal(got, head) {
				t.Fatalf("item %d: head %d bytes (kind %d), then Get %d bytes (kind %d) %v %v", i, len(head), hk, len(got), kind, ok, err)
			}
			if after, _, _ := r.Len(); after != items-1 {
				t.Fatalf("Head took a record: %d items, then %d after one Get", items, after)
			}
			if items == 1 {
				r.Put(RecItem, got) // keep the ring busy for the next lap
				break
			}
		}
	}
	if pads == 0 {
		t.Fatal("no head record lay past a pad record: the test did not wrap")
	}
}
