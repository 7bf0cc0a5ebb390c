package statemem

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// clientOf maps r as a client of slot does, from the ring's descriptor.
func clientOf(t *testing.T, r *Ring, slot uint32) *ClientRing {
	t.Helper()
	return clientOfKind(t, r, slot, false)
}

// clientOfKind is clientOf for a JoinableQueue's ring when joinable.
func clientOfKind(t *testing.T, r *Ring, slot uint32, joinable bool) *ClientRing {
	t.Helper()
	var c *ClientRing
	err := r.WithFD(func(fd int) error {
		var err error
		c, err = OpenRing(fd, r.Size(), r.Capacity(), r.Inline(), r.Maxsize(), slot, joinable)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var never = func(uint32) bool { return false }

// daemonPut and daemonGet are the daemon's side of the ring.
func daemonPut(t *testing.T, r *Ring, kind uint32, p []byte) {
	t.Helper()
	if r.Lock(never) != nil {
		t.Fatal("lock")
	}
	ok, err := r.Fits(uint64(len(p)))
	if err != nil || !ok {
		t.Fatalf("daemon put: fits %v %v", ok, err)
	}
	r.Put(kind, p)
	r.Unlock(true)
}

func daemonGet(t *testing.T, r *Ring) []byte {
	t.Helper()
	if r.Lock(never) != nil {
		t.Fatal("lock")
	}
	kind, p, ok, err := r.Get()
	r.Unlock(ok)
	if err != nil || !ok || kind != RecItem {
		t.Fatalf("daemon get: kind %d %v %v", kind, ok, err)
	}
	return p
}

func clientGet(t *testing.T, c *ClientRing, d time.Duration) ([]byte, Result) {
	t.Helper()
	var got []byte
	res, err := c.Get(d, func(p []byte) error { got = p; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return got, res
}

// A client's records are the daemon's and the reverse, over many laps of
// the ring (pad records at its end), in one FIFO.
func TestClientRingSharesRecordsWithDaemon(t *testing.T) {
	r := newTestRing(t, 0)
	c := clientOf(t, r, 5)
	next, want := 0, 0
	item := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 1+i%300) }
	for lap := 0; lap < 100; lap++ {
		for k := 0; k < 5; k++ {
			if (lap+k)%2 == 0 {
				if res := c.Put(item(next), 0); res != OK {
					t.Fatalf("lap %d: client put %v", lap, res)
				}
			} else {
				daemonPut(t, r, RecItem, item(next))
			}
			next++
		}
		for k := 0; k < 5; k++ {
			var p []byte
			if (lap+k)%2 == 0 {
				p = daemonGet(t, r)
			} else {
				var res Result
				if p, res = clientGet(t, c, 0); res != OK {
					t.Fatalf("lap %d: client get %v", lap, res)
				}
			}
			if !bytes.Equal(p, item(want)) {
				t.Fatalf("lap %d: item %d wrong", lap, want)
			}
			want++
		}
	}
	if n, ok := c.Len(); !ok || n != 0 {
		t.Fatalf("Len %d %v", n, ok)
	}
	if _, res := clientGet(t, c, 0); res != Busy {
		t.Fatalf("get from an empty ring: %v", res)
	}
}

// The client keeps maxsize and the inline maximum from the daemon's reply,
// and leaves a ring with no room for the daemon.
func TestClientRingLimits(t *testing.T) {
	r, err := NewRing(4096, 2, 1024)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	c := clientOf(t, r, 3)
	if res := c.Put(make([]byte, 1025), 0); res != Daemon {
		t.Fatalf("an item over the inline maximum: %v", res)
	}
	for i := 0; i < 2; i++ {
		if res := c.Put([]byte{byte(i)}, 0); res != OK {
			t.Fatal(res)
		}
	}
	if res := c.Put([]byte{2}, 0); res != Busy {
		t.Fatalf("put at maxsize: %v", res)
	}
	if res := c.Put([]byte{2}, 20*time.Millisecond); res != Busy {
		t.Fatalf("waiting put at maxsize: %v", res)
	}
	if n, ok := c.Len(); !ok || n != 2 {
		t.Fatalf("Len %d %v", n, ok)
	}

	u := newTestRing(t, 0)
	cu := clientOf(t, u, 3)
	for i := 0; ; i++ {
		res := cu.Put(make([]byte, 1000), 0)
		if res == Daemon {
			break
		}
		if res != OK || i > 10 {
			t.Fatalf("put %d into an unbounded ring: %v", i, res)
		}
	}
}

// A get hands a private copy to take before it commits: a take that fails
// leaves the item at the head.
func TestClientRingFailedTakeLeavesItem(t *testing.T) {
	r := newTestRing(t, 0)
	c := clientOf(t, r, 4)
	if c.Put([]byte("item"), 0) != OK {
		t.Fatal("put")
	}
	bad := errors.New("does not decode")
	var seen []byte
	res, err := c.Get(0, func(p []byte) error { seen = p; return bad })
	if err != bad || res == OK {
		t.Fatalf("failed take: %v %v", res, err)
	}
	seen[0] = 'X' // a private copy: the ring keeps its bytes
	if p := daemonGet(t, r); string(p) != "item" {
		t.Fatalf("the item after a failed take: %q", p)
	}
}

// Any flag, a record the daemon keeps, a latch held past LatchGrace and
// scribbled words all answer Daemon and change nothing.
func TestClientRingSendsToDaemon(t *testing.T) {
	r := newTestRing(t, 0)
	c := clientOf(t, r, 6)

	r.SetFlags(1 << 5) // a bit the client does not know
	if c.Put([]byte("a"), 0) != Daemon {
		t.Fatal("put with a flag set")
	}
	if _, res := clientGet(t, c, 0); res != Daemon {
		t.Fatal("get with a flag set")
	}
	if _, ok := c.Len(); ok {
		t.Fatal("Len with a flag set")
	}
	r.SetFlags(0)

	// RingFlagOver alone (the daemon holds the newest items): puts go to
	// the daemon, gets take from the ring while it holds records, then go
	// to the daemon (even a non-blocking one: the daemon may hold items).
	daemonPut(t, r, RecItem, []byte("in the ring"))
	r.SetFlags(RingFlagOver)
	if c.Put([]byte("a"), 0) != Daemon {
		t.Fatal("put with RingFlagOver")
	}
	if p, res := clientGet(t, c, 0); res != OK || string(p) != "in the ring" {
		t.Fatalf("get with RingFlagOver and a record in the ring: %q %v", p, res)
	}
	for _, d := range []time.Duration{0, time.Second} {
		if _, res := clientGet(t, c, d); res != Daemon {
			t.Fatalf("get (wait %v) with RingFlagOver and the ring empty: %v", d, res)
		}
	}
	r.SetFlags(RingFlagDaemon | RingFlagOver)
	daemonPut(t, r, RecItem, []byte("behind the daemon's"))
	if _, res := clientGet(t, c, 0); res != Daemon {
		t.Fatal("get with RingFlagDaemon")
	}
	r.SetFlags(0)
	if p, res := clientGet(t, c, 0); res != OK || string(p) != "behind the daemon's" {
		t.Fatalf("get after the flags cleared: %q %v", p, res)
	}

	daemonPut(t, r, RecExternal, make([]byte, 8))
	if _, res := clientGet(t, c, 0); res != Daemon {
		t.Fatalf("get of an external record: %v", res)
	}
	if r.Lock(never) != nil {
		t.Fatal("lock")
	}
	if kind, _, ok, err := r.Get(); kind != RecExternal || !ok || err != nil {
		t.Fatal("the external record was not left at the head")
	}
	r.Unlock(true)

	r.TestSetWord(RingOffLatch, 77) // held by someone else
	if c.Put([]byte("a"), 0) != Daemon {
		t.Fatal("put past a latch held longer than LatchGrace")
	}
	r.TestSetWord(RingOffLatch, 0)

	for name, w := range map[string]uint64{
		"tail past capacity":  1<<20 | 1<<40,
		"misaligned tail":     3 | 1<<40,
		"more items than fit": 8 | 100<<40,
	} {
		r.TestSetWord(RingOffTail, w)
		seq := r.Seq()
		if c.Put([]byte("a"), 0) != Daemon {
			t.Fatalf("%s: put", name)
		}
		if _, res := clientGet(t, c, 0); res != Daemon {
			t.Fatalf("%s: get", name)
		}
		if r.Seq() != seq || atomic.LoadUint64(r.word(ringOffTail)) != w || atomic.LoadUint64(r.word(ringOffLatch)) != 0 {
			t.Fatalf("%s: the ring changed", name)
		}
	}
}

// setData stores x at byte off of r's data area, as a scribbler would.
func setData(r *Ring, off int, x uint64) {
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&r.mem[RingHeader+off])), x)
}

// A record header scribbled on (a length past the area) answers Daemon.
func TestClientRingScribbledRecord(t *testing.T) {
	r := newTestRing(t, 0)
	c := clientOf(t, r, 6)
	if c.Put([]byte("abcdefgh"), 0) != OK {
		t.Fatal("put")
	}
	setData(r, 0, 1<<31|uint64(RecItem)<<32)
	if _, res := clientGet(t, c, 0); res != Daemon {
		t.Fatalf("get of a record longer than the area: %v", res)
	}
	setData(r, 0, 100|uint64(RecItem)<<32)
	if _, res := clientGet(t, c, 0); res != Daemon {
		t.Fatalf("get of a record longer than the used bytes: %v", res)
	}
}

// A waiting get registers in the waiter table, sleeps on seq and is woken
// by the daemon's put; the counts drop when it leaves.
func TestClientRingWaitWokenByDaemon(t *testing.T) {
	r := newTestRing(t, 0)
	c := clientOf(t, r, 9)
	got := make(chan []byte, 1)
	go func() {
		for {
			var p []byte
			res, _ := c.Get(time.Second, func(b []byte) error { p = b; return nil })
			if res == OK {
				got <- p
				return
			}
		}
	}()
	end := time.Now().Add(10 * time.Second)
	for r.Waiting() != 1 {
		if time.Now().After(end) {
			t.Fatal("the getter never slept")
		}
		time.Sleep(time.Millisecond)
	}
	if w := r.Waiters(); len(w) != 1 || w[0].Slot != 9 || w[0].Op != RingWaitGet {
		t.Fatalf("waiter table %+v", w)
	}
	daemonPut(t, r, RecItem, []byte("wake"))
	select {
	case p := <-got:
		if string(p) != "wake" {
			t.Fatalf("got %q", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the getter was not woken")
	}
	if r.Waiting() != 0 {
		t.Fatalf("%d waiters left", r.Waiting())
	}
}

// OpenRing refuses a layout that does not match the file.
func TestOpenRingChecksLayout(t *testing.T) {
	r := newTestRing(t, 0)
	for name, f := range map[string]func(fd int) error{
		"capacity":  func(fd int) error { _, err := OpenRing(fd, r.Size(), 8192, 1024, 0, 1, false); return err },
		"size":      func(fd int) error { _, err := OpenRing(fd, r.Size()+4096, 4096, 1024, 0, 1, false); return err },
		"inline":    func(fd int) error { _, err := OpenRing(fd, r.Size(), 4096, 2048, 0, 1, false); return err },
		"slot zero": func(fd int) error { _, err := OpenRing(fd, r.Size(), 4096, 1024, 0, 0, false); return err },
		// a JoinableQueue's client needs an owed entry
		"joinable slot": func(fd int) error { _, err := OpenRing(fd, r.Size(), 4096, 1024, 0, RingSlots, true); return err },
	} {
		if err := r.WithFD(f); err == nil {
			t.Fatalf("%s: a wrong layout was accepted", name)
		}
	}
}

// joinWords reads the JoinableQueue words of r's header: the journal op and
// the done word.
func joinWords(r *Ring) (journal, done uint64) {
	return r.TestWord(ringOffJOp), r.TestWord(ringOffDone)
}

// On a JoinableQueue's ring a client's get raises its own owed entry (the
// journal cleared after), TaskDone pays its own debt first, else the first
// owing entry's, and one too many stores nothing; Join answers at once
// whether tasks are unfinished, and a waiting Join registers as a join
// waiter and is woken by the last TaskDone. A Queue's client leaves both
// to the daemon.
func TestClientRingJoinableCounts(t *testing.T) {
	r := newTestRing(t, 0)
	c5 := clientOfKind(t, r, 5, true)
	c7 := clientOfKind(t, r, 7, true)
	for i := 0; i < 3; i++ {
		if res := c5.Put([]byte{byte(i)}, 0); res != OK {
			t.Fatalf("put %d: %v", i, res)
		}
	}
	if n := r.UnfinishedNow(); n != 3 {
		t.Fatalf("unfinished %d after 3 puts", n)
	}
	for i := 0; i < 2; i++ {
		if _, res := clientGet(t, c5, 0); res != OK {
			t.Fatalf("get %d: %v", i, res)
		}
	}
	if j, _ := joinWords(r); r.Owed(5) != 2 || j != 0 {
		t.Fatalf("after 2 gets: owed %d, journal %#x", r.Owed(5), j)
	}
	if res := c7.TaskDone(); res != OK || r.Owed(5) != 1 || r.UnfinishedNow() != 2 {
		t.Fatalf("task_done by a slot that owes nothing: %v, owed %d, unfinished %d", res, r.Owed(5), r.UnfinishedNow())
	}
	if _, res := clientGet(t, c7, 0); res != OK || r.Owed(7) != 1 {
		t.Fatalf("get by slot 7: %v, owed %d", res, r.Owed(7))
	}
	if res := c7.TaskDone(); res != OK || r.Owed(7) != 0 || r.Owed(5) != 1 {
		t.Fatalf("task_done pays its own debt first: %v, owed 7: %d, 5: %d", res, r.Owed(7), r.Owed(5))
	}
	if res := c5.Join(0); res != Busy {
		t.Fatalf("join with one unfinished: %v", res)
	}
	if res := c5.TaskDone(); res != OK || r.Owed(5) != 0 || r.UnfinishedNow() != 0 {
		t.Fatalf("last task_done: %v, owed %d, unfinished %d", res, r.Owed(5), r.UnfinishedNow())
	}
	if res := c5.Join(0); res != OK {
		t.Fatalf("join with none unfinished: %v", res)
	}
	_, done := joinWords(r)
	seq := r.Seq()
	if res := c7.TaskDone(); res != Busy {
		t.Fatalf("one task_done too many: %v", res)
	}
	if j, d := joinWords(r); j != 0 || d != done || r.Seq() != seq || r.TestWord(RingOffLatch) != 0 {
		t.Fatalf("a refused task_done stored something: journal %#x, done %d (was %d), seq %d (was %d)", j, d, done, r.Seq(), seq)
	}

	// A waiting Join is woken by the last task_done.
	if res := c7.Put([]byte("x"), 0); res != OK {
		t.Fatal(res)
	}
	joined := make(chan Result, 1)
	go func() {
		for {
			if res := c5.Join(time.Second); res != Busy {
				joined <- res
				return
			}
		}
	}()
	end := time.Now().Add(10 * time.Second)
	for r.Waiting() != 1 {
		if time.Now().After(end) {
			t.Fatal("the joiner never slept")
		}
		time.Sleep(time.Millisecond)
	}
	if w := r.Waiters(); len(w) != 1 || w[0].Slot != 5 || w[0].Op != RingWaitJoin {
		t.Fatalf("waiter table %+v", w)
	}
	if _, res := clientGet(t, c7, 0); res != OK {
		t.Fatal(res)
	}
	select {
	case res := <-joined:
		t.Fatalf("join returned %v with the item got, not done", res)
	default:
	}
	if res := c7.TaskDone(); res != OK {
		t.Fatal(res)
	}
	select {
	case res := <-joined:
		if res != OK {
			t.Fatalf("woken join: %v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the joiner was not woken")
	}

	q := clientOf(t, r, 9) // not joinable: the daemon's
	if res := q.TaskDone(); res != Daemon {
		t.Fatalf("task_done by a Queue's client: %v", res)
	}
	if res := q.Join(0); res != Daemon {
		t.Fatalf("join by a Queue's client: %v", res)
	}
}

// The unfinished count is kept mod 2^24: a put that would bring it to
// RingMaxUnfinished waits as on a full queue (Busy without waiting), and
// goes in once a task is done.
func TestClientRingJoinableUnfinishedBound(t *testing.T) {
	r := newTestRing(t, 0)
	c := clientOfKind(t, r, 3, true)
	if r.Lock(never) != nil {
		t.Fatal("lock")
	}
	r.AddDone(-int64(RingMaxUnfinished - 1)) // as if that many were put and never done
	r.Unlock(false)
	if res := c.Put([]byte("a"), 0); res != OK {
		t.Fatalf("put up to the bound: %v", res)
	}
	if n := r.UnfinishedNow(); n != RingMaxUnfinished {
		t.Fatalf("unfinished %d", n)
	}
	tail := r.TestWord(RingOffTail)
	if res := c.Put([]byte("b"), 0); res != Busy || r.TestWord(RingOffTail) != tail {
		t.Fatalf("put past the bound: %v", res)
	}
	if res := c.Put([]byte("b"), 5*time.Millisecond); res != Busy {
		t.Fatalf("waiting put past the bound: %v", res)
	}
	if _, res := clientGet(t, c, 0); res != OK {
		t.Fatal(res)
	}
	if res := c.TaskDone(); res != OK {
		t.Fatal(res)
	}
	if res := c.Put([]byte("b"), 0); res != OK {
		t.Fatalf("put after a task_done: %v", res)
	}
}
