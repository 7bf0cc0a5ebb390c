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

// PutMany writes what Puts of the same payloads, each after its Fits,
// write, up to the first that does not fit (the ring's maxsize included),
// and stops there: the same bytes and words, over many laps of a small
// ring (pad records) and of a large one (the hot window's restarts).
func TestRingPutManyIsPutsInOne(t *testing.T) {
	for _, c := range []struct {
		name              string
		capacity, maxsize uint64
		most              int
	}{{"small", 4096, 0, 300}, {"maxsize", 4096, 9, 40}, {"hot window", 1 << 20, 0, 2000}} {
		t.Run(c.name, func(t *testing.T) {
			one, err := NewRing(c.capacity, c.maxsize, c.capacity/4)
			if err != nil {
				t.Fatal(err)
			}
			defer one.Close()
			many, err := NewRing(c.capacity, c.maxsize, c.capacity/4)
			if err != nil {
				t.Fatal(err)
			}
			defer many.Close()
			for _, r := range []*Ring{one, many} {
				if r.Lock(noneGone) != nil {
					t.Fatal("lock")
				}
				defer r.Unlock(true)
			}
			next, wrote := 0, 0
			for round := 0; round < 3000; round++ {
				batch := make([][]byte, 1+round%23)
				for i := range batch {
					batch[i] = bytes.Repeat([]byte{byte(next + i)}, 1+(next+i*7)%c.most)
				}
				want := 0
				for _, p := range batch {
					ok, err := one.Fits(uint64(len(p)))
					if err != nil {
						t.Fatal(err)
					}
					if !ok {
						break
					}
					if err := one.Put(RecItem, p); err != nil {
						t.Fatal(err)
					}
					want++
				}
				got, err := many.PutMany(RecItem, batch)
				if err != nil || got != want {
					t.Fatalf("round %d: PutMany stored %d (%v), Puts %d", round, got, err, want)
				}
				next += len(batch)
				wrote += got
				if !bytes.Equal(one.mem, many.mem) {
					t.Fatalf("round %d: the rings differ", round)
				}
				take := round%5 + got/2 // some, so that both lap; now and then all (the hot window's restarts)
				if round%7 == 0 {
					take = int(^uint(0) >> 1)
				}
				for i := 0; i < take; i++ {
					k1, p1, ok1, err1 := one.Get()
					k2, p2, ok2, err2 := many.Get()
					if k1 != k2 || !bytes.Equal(p1, p2) || ok1 != ok2 || err1 != nil || err2 != nil {
						t.Fatalf("round %d: gets differ", round)
					}
					if !ok1 {
						break
					}
				}
			}
			if wrote < 3000 {
				t.Fatalf("only %d records written", wrote)
			}
		})
	}
}

// PutMany reads the words once and checks them: a scribbled tail gets
// ErrRingCorrupt and nothing is written.
func TestRingPutManyChecksTheWords(t *testing.T) {
	r := newTestRing(t, 0)
	if r.Lock(noneGone) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(false)
	r.TestSetWord(RingOffTail, 3|1<<40)
	if n, err := r.PutMany(RecItem, [][]byte{[]byte("a"), []byte("b")}); n != 0 || !errors.Is(err, ErrRingCorrupt) {
		t.Fatalf("PutMany on a scribbled tail: %d, %v", n, err)
	}
	if tail := atomic.LoadUint64(r.word(ringOffTail)); tail != 3|1<<40 {
		t.Fatalf("the tail moved to %x", tail)
	}
}

// GetMany takes what Gets would, in order, with its stops: max, the
// budget (payload and framing), an external record (left at the head for
// the caller), the end of the ring; the copies are capped at their own
// lengths, so an append to one never writes into the next.
func TestRingGetManyIsGetsInOne(t *testing.T) {
	one, many := newTestRing(t, 0), newTestRing(t, 0)
	for _, r := range []*Ring{one, many} {
		if r.Lock(noneGone) != nil {
			t.Fatal("lock")
		}
		defer r.Unlock(true)
	}
	next := 0
	for round := 0; round < 3000; round++ {
		for _, r := range []*Ring{one, many} {
			for i := 0; i < round%9; i++ {
				p := bytes.Repeat([]byte{byte(next + i)}, (next+i*13)%200)
				kind := RecItem
				if (next+i)%17 == 0 {
					kind, p = RecExternal, []byte{1, 2, 3, 4, 5, 6, 7, byte(next + i)}
				}
				if ok, _ := r.Fits(uint64(len(p))); ok {
					if err := r.Put(kind, p); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		next += round % 9
		max, budget, framing := 1+round%70, int64(50+round%900), int64(round%3)
		var want [][]byte
		var spent int64
		for len(want) < max {
			kind, p, ok, err := one.Head()
			if err != nil {
				t.Fatal(err)
			}
			if !ok || kind != RecItem || int64(len(p))+framing > budget-spent {
				break
			}
			_, p, _, _ = one.Get()
			want = append(want, p)
			spent += int64(len(p)) + framing
		}
		got, used, err := many.GetMany(max, budget, framing)
		if err != nil || used != spent || len(got) != len(want) {
			t.Fatalf("round %d: GetMany took %d items, %d bytes (%v); Gets %d, %d", round, len(got), used, err, len(want), spent)
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) || cap(got[i]) != len(got[i]) {
				t.Fatalf("round %d: item %d differs", round, i)
			}
		}
		if !bytes.Equal(one.mem, many.mem) {
			t.Fatalf("round %d: the rings differ", round)
		}
		if round%4 == 0 { // an external record at the head is the caller's: both take it
			for _, r := range []*Ring{one, many} {
				if kind, _, ok, _ := r.Head(); ok && kind == RecExternal {
					r.Get()
				}
			}
		}
	}
}

// A record that does not check out is the error when it is the first
// GetMany meets, and ends the batch before it otherwise, the head moved
// past what was taken.
func TestRingGetManyStopsAtABadRecord(t *testing.T) {
	r := newTestRing(t, 0)
	if r.Lock(noneGone) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(false)
	for _, p := range []string{"a", "bb", "ccc"} {
		if err := r.Put(RecItem, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	binary.LittleEndian.PutUint32(r.mem[RingHeader+2*recHeader+4:], 99) // the second record's kind
	got, _, err := r.GetMany(10, 1<<20, 0)
	if err != nil || len(got) != 1 || string(got[0]) != "a" {
		t.Fatalf("GetMany: %q, %v; want the first item only", got, err)
	}
	if got, _, err := r.GetMany(10, 1<<20, 0); err != ErrRingCorrupt || len(got) != 0 {
		t.Fatalf("GetMany at the bad record: %q, %v", got, err)
	}
}

// Past getChunk records GetMany goes on in a new allocation, in order.
func TestRingGetManyPastAChunk(t *testing.T) {
	r := newTestRing(t, 0)
	if r.Lock(noneGone) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(true)
	for i := 0; i < 3*getChunk+5; i++ {
		if err := r.Put(RecItem, []byte{byte(i), byte(i >> 8)}); err != nil {
			t.Fatal(err)
		}
	}
	got, used, err := r.GetMany(3*getChunk+1, 1<<20, 10)
	if err != nil || len(got) != 3*getChunk+1 || used != int64(len(got))*12 {
		t.Fatalf("GetMany: %d items, %d bytes, %v", len(got), used, err)
	}
	for i, p := range got {
		if len(p) != 2 || p[0] != byte(i) || p[1] != byte(i>>8) || cap(p) != 2 {
			t.Fatalf("item %d is %v", i, p)
		}
	}
	if items, _, _ := r.Len(); items != 4 {
		t.Fatalf("%d items left, want 4", items)
	}
}
