package statemem

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

func noneGone(uint32) bool { return false }

func allocated(t *testing.T, r *Ring) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := r.WithFD(func(fd int) error { return unix.Fstat(fd, &st) }); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// A large ring is sparse: a new one holds only its header's pages, not its
// whole data area.
func TestRingLargeIsSparse(t *testing.T) {
	r, err := NewRing(64<<20, 0, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Inline() != 16<<20 {
		t.Fatalf("inline %d, want 16 MiB", r.Inline())
	}
	if a := allocated(t, r); a > 1<<20 {
		t.Fatalf("a new 64 MiB ring holds %d bytes of memory, want its pages untouched", a)
	}
	if _, err := NewRing(2<<30, 0, 0); err == nil {
		t.Fatal("a 2 GiB ring was made; the bound is 1 GiB")
	}
}

// Hot window: a long stream of small items through a ring that never holds
// more than a few stays in the first RingHot bytes, in order.
func TestRingHotWindow(t *testing.T) {
	r, err := NewRing(4<<20, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Lock(noneGone) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(true)
	next, want := 0, 0
	for round := 0; round < 20000; round++ {
		for i := 0; i < 3; i++ {
			p := bytes.Repeat([]byte{byte(next)}, 100+next%200)
			if ok, err := r.Fits(uint64(len(p))); !ok || err != nil {
				t.Fatalf("round %d: fits %v %v", round, ok, err)
			}
			r.Put(RecItem, p)
			next++
			tp, _ := r.tail()
			if idx := tp & (r.cap - 1); idx > RingHot+3*(recHeader+pad8(300)) {
				t.Fatalf("round %d: the tail is at index %d, past the hot window", round, idx)
			}
		}
		for i := 0; i < 3; i++ {
			kind, p, ok, err := r.Get()
			if err != nil || !ok || kind != RecItem || len(p) != 100+want%200 || p[0] != byte(want) {
				t.Fatalf("round %d: got kind %d %d bytes %v %v, want item %d", round, kind, len(p), ok, err, want)
			}
			want++
		}
	}
	if a := allocated(t, r); a > RingHeader+2*RingHot {
		t.Fatalf("a ring of small items holds %d bytes of memory", a)
	}
}

// A ring that held large items gives its pages past the hot window back
// once it is empty and idle, and works as before after.
func TestRingTrim(t *testing.T) {
	r, err := NewRing(16<<20, 0, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	big := bytes.Repeat([]byte{7}, 3<<20)
	r.Lock(noneGone)
	for i := 0; i < 3; i++ {
		r.Put(RecItem, big)
	}
	r.Unlock(true)
	if a := allocated(t, r); a < 9<<20 {
		t.Fatalf("after 9 MiB of items the ring holds %d bytes", a)
	}
	seq, punched, err := r.Trim(r.Seq() + 1)
	if err != nil || punched {
		t.Fatalf("trim of a ring that is not idle: %v %v", punched, err)
	}
	if _, punched, _ = r.Trim(seq); punched {
		t.Fatal("trimmed a ring that holds items")
	}
	r.Lock(noneGone)
	for i := 0; i < 3; i++ {
		if _, p, ok, err := r.Get(); !ok || err != nil || !bytes.Equal(p, big) {
			t.Fatalf("get %d: %v %v", i, ok, err)
		}
	}
	r.Unlock(true)
	// The latch held by a client: no trim, no wait.
	r.TestSetWord(RingOffLatch, 5)
	if _, punched, _ := r.Trim(r.Seq()); punched {
		t.Fatal("trimmed under a client's latch")
	}
	r.TestSetWord(RingOffLatch, 0)
	if _, punched, err := r.Trim(r.Seq()); !punched || err != nil {
		t.Fatalf("an empty idle ring was not trimmed: %v", err)
	}
	if a := allocated(t, r); a > RingHeader+RingHot+1<<16 {
		t.Fatalf("after the trim the ring holds %d bytes", a)
	}
	if _, punched, _ := r.Trim(r.Seq()); punched {
		t.Fatal("trimmed twice: nothing was left to punch")
	}
	r.Lock(noneGone)
	r.Put(RecItem, big)
	r.Put(RecItem, []byte("small"))
	r.Unlock(true)
	r.Lock(noneGone)
	defer r.Unlock(true)
	if _, p, ok, err := r.Get(); !ok || err != nil || !bytes.Equal(p, big) {
		t.Fatalf("after the trim: %v %v", ok, err)
	}
	if _, p, ok, err := r.Get(); !ok || err != nil || string(p) != "small" {
		t.Fatalf("after the trim: %q %v %v", p, ok, err)
	}
}

// Hot window, non-empty ring: 1 MiB items streaming through a 64 MiB ring
// that always holds a few of them go back to index 0 whenever the next one
// fits before them, so the ring touches a few MiB, not all 64, in order.
func TestRingHotWindowBehindAConsumer(t *testing.T) {
	r, err := NewRing(64<<20, 0, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Lock(noneGone) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(true)
	const lag, item = 3, 1 << 20
	put := func(i int) {
		p := bytes.Repeat([]byte{byte(i)}, item+i%7)
		if ok, err := r.Fits(uint64(len(p))); !ok || err != nil {
			t.Fatalf("item %d: fits %v %v", i, ok, err)
		}
		r.Put(RecItem, p)
		tp, _ := r.tail()
		if idx := tp & (r.cap - 1); idx > RingHot+3*(lag+2)*(item+64) {
			t.Fatalf("item %d: the tail is at index %d: the ring sweeps its whole area", i, idx)
		}
	}
	for i := 0; i < lag; i++ {
		put(i)
	}
	for i := lag; i < 300; i++ {
		put(i)
		want := i - lag
		kind, p, ok, err := r.Get()
		if err != nil || !ok || kind != RecItem || len(p) != item+want%7 || p[0] != byte(want) {
			t.Fatalf("get %d: kind %d, %d bytes, %v %v", want, kind, len(p), ok, err)
		}
	}
	if a := allocated(t, r); a > int64(RingHeader)+RingHot+3*(lag+2)*(item+64) {
		t.Fatalf("the ring holds %d bytes of memory for %d items of 1 MiB in flight", a, lag+1)
	}
}
