package manager

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// The daemon trusts nothing it reads from the segment: these tests write
// words, latches and ledger entries as a buggy or hostile process of the
// user could, and check that the daemon's ops keep their deadlines, a
// session's end never waits on another object, and every other object
// keeps its state.

// holdLatch makes the latch of the Semaphore whose word is w read slot, as
// a session stopped between the steps of an op leaves it; the returned
// function lets it go (the op's commit, adding nothing).
func holdLatch(t *testing.T, w *uint64, slot uint32) (letGo func()) {
	t.Helper()
	x := atomic.LoadUint64(w)
	if !atomic.CompareAndSwapUint64(w, x, x&^statemem.MaskLatch|uint64(slot)<<statemem.LatchShift) {
		t.Fatal("latch")
	}
	return func() {
		for {
			x := atomic.LoadUint64(w)
			if atomic.CompareAndSwapUint64(w, x, x&^(statemem.MaskLatch|statemem.BitWaiters)) {
				statemem.WakeAll(w)
				return
			}
		}
	}
}

// eventually waits up to bound for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", bound, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A live session holding the latch (stopped mid-op): the daemon's
// non-blocking acquire answers false at once and a timed one at its
// deadline; neither waits for the holder.
func TestLatchWaitHonoursTheDeadline(t *testing.T) {
	m, seg := fastManager(t)
	a, stopped := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	sem := create[*Semaphore](t, m, a, KindSemaphore, "s", Params{Value: 3})
	w, _ := semWords(t, m, seg, sem, stopped)
	letGo := holdLatch(t, w, uint32(stopped.Slot()))

	start := time.Now()
	if ok, err := sem.Acquire(ctx, a, 1, false, 0); ok || err != nil {
		t.Fatalf("non-blocking acquire behind a held latch: %v %v", ok, err)
	}
	if d := time.Since(start); d > bound/2 {
		t.Fatalf("non-blocking acquire took %v", d)
	}
	start = time.Now()
	if ok, err := sem.Acquire(ctx, a, 1, true, 200*time.Millisecond); ok || err != nil {
		t.Fatalf("timed acquire behind a held latch: %v %v", ok, err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > bound/2 {
		t.Fatalf("timed acquire of 200ms took %v", d)
	}
	letGo()
	if ok, err := sem.Acquire(ctx, a, 1, false, 0); !ok || err != nil {
		t.Fatalf("acquire once the latch is free: %v %v", ok, err)
	}
	if sem.Value() != 2 {
		t.Fatalf("value %d, want 2", sem.Value())
	}
}

// A session that ends while another live session holds the latch of one
// of its Semaphores: its end returns at once, its units in every other
// Semaphore come back at once, and those in the latched one when the latch
// is let go. Its slot is not reused meanwhile.
func TestSessionEndNeverWaitsOnAnotherLatch(t *testing.T) {
	m, seg := fastManager(t)
	a, b, stopped := newSession(t, m), newSession(t, m), newSession(t, m)
	x := create[*Semaphore](t, m, a, KindSemaphore, "x", Params{Value: 5})
	y := create[*Semaphore](t, m, a, KindSemaphore, "y", Params{Value: 5})
	wx, ex := semWords(t, m, seg, x, b)
	wy, ey := semWords(t, m, seg, y, b)
	semWords(t, m, seg, y, stopped)
	for i := 0; i < 5; i++ {
		if statemem.SemAcquire(wx, ex, uint32(b.Slot()), 0) != statemem.OK || statemem.SemAcquire(wy, ey, uint32(b.Slot()), 0) != statemem.OK {
			t.Fatal("fast acquire")
		}
	}
	letGo := holdLatch(t, wy, uint32(stopped.Slot()))
	ended := async(func() (bool, error) { m.CloseSession(b); return true, nil })
	recv(t, ended)
	if x.Value() != 5 || *ex != 0 {
		t.Fatalf("x after b's end: value %d, ledger %d", x.Value(), *ex)
	}
	if y.Value() != 0 || !m.slots.Live(b.Slot()) {
		t.Fatalf("y gave back under a live latch (value %d), or b's slot was freed", y.Value())
	}
	letGo()
	eventually(t, "y's units come back once the latch is free", func() bool { return y.Value() == 5 })
	eventually(t, "b's slot is freed", func() bool { return !m.slots.Live(b.Slot()) })
	if *ey != 0 {
		t.Fatalf("b's entry in y: %d", *ey)
	}
}

// A latch naming no live attached session (a stray store, the daemon's own
// value, the largest slot id) is taken over by the daemon's next op at
// once, and by the sweep without any op.
func TestStrayLatchTakenOverAtOnce(t *testing.T) {
	m, seg := fastManager(t)
	a := newSession(t, m)
	ctx := testCtx(t)
	sem := create[*Semaphore](t, m, a, KindSemaphore, "s", Params{Value: 2})
	w := seg.State(fastRef(t, m, sem).Off)
	for _, stray := range []uint32{uint32(a.Slot()), 77, statemem.LatchDaemon} { // a: live but never attached
		holdLatch(t, w, stray)
		start := time.Now()
		if ok, err := sem.Acquire(ctx, a, 1, false, 0); !ok || err != nil || time.Since(start) > bound/2 {
			t.Fatalf("latch %d: acquire %v %v after %v", stray, ok, err, time.Since(start))
		}
		if err := sem.Release(a, 1); err != nil {
			t.Fatal(err)
		}
		if sem.Value() != 2 || sem.st.Latched() != 0 {
			t.Fatalf("latch %d: value %d, latch %d", stray, sem.Value(), sem.st.Latched())
		}
	}
	holdLatch(t, w, 1<<29-1)
	m.sweepFast(m.fast)
	if sem.st.Latched() != 0 || sem.Value() != 2 {
		t.Fatalf("after the sweep: latch %d, value %d", sem.st.Latched(), sem.Value())
	}
}

// A ledger entry of 0xFFFFFFFF costs nothing at the session's end: it is
// read clamped to what the total leaves, given back in one sum, and never
// spills into the latch or flag bits.
func TestHugeLedgerEntryIsClamped(t *testing.T) {
	m, seg := fastManager(t)
	a, b := newSession(t, m), newSession(t, m)
	sem := create[*Semaphore](t, m, a, KindSemaphore, "s", Params{Value: 3})
	other := create[*Semaphore](t, m, a, KindSemaphore, "o", Params{Value: 4})
	w, e := semWords(t, m, seg, sem, b)
	if statemem.SemAcquire(w, e, uint32(b.Slot()), 0) != statemem.OK {
		t.Fatal("fast acquire")
	}
	atomic.StoreUint32(e, 0xFFFFFFFF)
	start := time.Now()
	m.CloseSession(b)
	if d := time.Since(start); d > bound/2 {
		t.Fatalf("session end took %v", d)
	}
	if x := atomic.LoadUint64(w); x != 3 || sem.Value() != 3 {
		t.Fatalf("word %#x after the give-back, want 3 units and nothing else", x)
	}
	if other.Value() != 4 {
		t.Fatalf("another semaphore changed: %d", other.Value())
	}
}

// Words a stray store left in a state the daemon never made: a Lock or
// RLock owned by a slot no session has is freed (or handed to the daemon's
// waiter), a daemon bit with nobody queued is cleared; a Lock held by a
// live session stays held.
func TestStrayOwnersAndDaemonBitsAreCleared(t *testing.T) {
	m, seg := fastManager(t)
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	held := create[*Lock](t, m, a, KindLock, "held", Params{})
	lock := create[*Lock](t, m, a, KindLock, "l", Params{})
	rlock := create[*RLock](t, m, a, KindRLock, "r", Params{})
	ev := create[*Event](t, m, a, KindEvent, "e", Params{})
	if ok, _ := held.Acquire(ctx, a, 1, false, 0); !ok {
		t.Fatal("acquire")
	}
	wl, wr, we := seg.State(fastRef(t, m, lock).Off), seg.State(fastRef(t, m, rlock).Off), seg.State(fastRef(t, m, ev).Off)
	atomic.StoreUint64(wl, 4321)                                     // a slot no session has
	atomic.StoreUint64(wr, 999|3<<statemem.DepthShift)               // likewise, nested
	atomic.StoreUint64(we, atomic.LoadUint64(we)|statemem.BitDaemon) // nobody queued
	got := async(func() (bool, error) { return rlock.Acquire(ctx, b, 1, true, time.Minute) })
	waitWaiters(t, rlock, 1)
	m.sweepFast(m.fast)
	if r := recv(t, got); !r.v || r.err != nil {
		t.Fatalf("the daemon's waiter on the stray-owned RLock: %v %v", r.v, r.err)
	}
	if lock.Locked() || atomic.LoadUint64(we)&statemem.BitDaemon != 0 {
		t.Fatalf("lock word %#x, event word %#x", atomic.LoadUint64(wl), atomic.LoadUint64(we))
	}
	if !held.Locked() || held.st.Owner() != a.Slot() {
		t.Fatal("a live session's Lock was freed")
	}
	if statemem.EventSet(we) != statemem.OK {
		t.Fatal("the event is still sent to the daemon")
	}
}

// A stray heir field (a slot no session has) would keep a free lock from
// every fast client; the sweep clears it, and leaves a live slot's heir be.
func TestStrayHeirIsCleared(t *testing.T) {
	m, seg := fastManager(t)
	a := newSession(t, m)
	stray := create[*Lock](t, m, a, KindLock, "stray", Params{})
	kept := create[*Lock](t, m, a, KindLock, "kept", Params{})
	hs, hk := seg.Heir(fastRef(t, m, stray).Off), seg.Heir(fastRef(t, m, kept).Off)
	atomic.StoreUint32(hs, 4321)
	atomic.StoreUint32(hk, uint32(a.Slot()))
	m.sweepFast(m.fast)
	if h := atomic.LoadUint32(hs); h != 0 {
		t.Fatalf("stray heir %d left in place", h)
	}
	if h := atomic.LoadUint32(hk); h != uint32(a.Slot()) {
		t.Fatalf("a live slot's heir was cleared: %d", h)
	}
}
