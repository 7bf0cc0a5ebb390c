package statemem

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

func tableSeg(t *testing.T) *Segment {
	t.Helper()
	s := newSeg(t, 64)
	if err := s.AllocWaitTable(8); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestWaitTableBounds(t *testing.T) {
	s := tableSeg(t)
	if len(s.WaitTable()) != 8 {
		t.Fatalf("table of %d entries, want 8", len(s.WaitTable()))
	}
	// The header is data: a table that would run past the mapping is none.
	hdr := (*uint32)(unsafe.Pointer(&s.mem[HdrWaitersLen]))
	atomic.StoreUint32(hdr, 1<<30)
	if s.WaitTable() != nil {
		t.Fatal("trusted a table length past the segment")
	}
	atomic.StoreUint32(hdr, 8)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.mem[HdrWaiters])), 65)
	if s.WaitTable() != nil {
		t.Fatal("trusted a misaligned table offset")
	}
	// A segment with no room keeps no table, and waits go unrecorded.
	small := newSeg(t, 4)
	if err := small.AllocWaitTable(512); err != ErrFull || small.WaitTable() != nil {
		t.Fatalf("small segment: %v", err)
	}
}

// Waits of any number of threads of one slot take entries of the shared
// table (none is kept to a few per slot); past the table's last free
// entry a wait goes unrecorded and is counted in the header until it ends.
func TestWaitTableIsSharedAndCountsOverflow(t *testing.T) {
	s := tableSeg(t) // 8 entries
	const n = 10
	var offs [n]uint32
	var waits [n]*Wait
	for i := range n {
		r, _ := s.Alloc(KindLock, 0, 0)
		offs[i] = r.Off
		w := s.State(r.Off)
		waits[i] = s.NewWait(3)
		waits[i].enter(w)
	}
	if got := len(s.Waiting(3)); got != 8 {
		t.Fatalf("slot 3 holds %d entries, want all 8", got)
	}
	if !s.Unrecorded() || atomic.LoadUint32(s.unrecorded()) != 2 {
		t.Fatalf("unrecorded count %d, want 2", atomic.LoadUint32(s.unrecorded()))
	}
	recorded := map[uint32]bool{}
	for _, e := range s.Waiting(3) {
		recorded[e.Off] = e.Since != 0
	}
	for i := range 8 { // the first eight waits got the entries
		if !recorded[offs[i]] {
			t.Fatalf("wait %d (offset %d) not recorded: %+v", i, offs[i], s.Waiting(3))
		}
	}
	for i := range n {
		waits[i].Done(s.State(offs[i]), OK)
	}
	if len(s.Waits()) != 0 || s.Unrecorded() {
		t.Fatalf("after the waits: %d entries, unrecorded %d", len(s.Waits()), atomic.LoadUint32(s.unrecorded()))
	}
	// The daemon frees an ended session's entries; the waiter's own late
	// Done leaves an entry someone else took since alone.
	wa, wb := s.NewWait(4), s.NewWait(5)
	wa.enter(s.State(offs[0]))
	s.ClearWaiting(4)
	wb.enter(s.State(offs[1]))
	wa.Done(s.State(offs[0]), OK)
	if e := s.Waits(); len(e) != 1 || e[0].Slot != 5 || e[0].Off != offs[1] {
		t.Fatalf("entries %+v, want slot 5's alone", e)
	}
	wb.Done(s.State(offs[1]), OK)
}

// A waiter holds an entry of its slot's record while it sleeps and frees it
// when the wait ends, whichever way.
func TestWaitRecordedWhileAsleep(t *testing.T) {
	s := tableSeg(t)
	r, _ := s.Alloc(KindLock, 0, 0)
	w, aux := s.State(r.Off), s.Aux(r.Off)
	if LockAcquire(w, aux, 1, 1, 0) != OK {
		t.Fatal("take")
	}
	done := make(chan Result, 1)
	go func() {
		wt := s.NewWait(2)
		res := LockAcquireWait(w, aux, 2, 9, 10*time.Second, wt)
		wt.Done(w, res)
		done <- res
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Waiting(2)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never showed in its record")
		}
		time.Sleep(time.Millisecond)
	}
	if e := s.Waiting(2); len(e) != 1 || e[0].Off != r.Off || e[0].Since == 0 {
		t.Fatalf("record %+v", e)
	}
	if LockRelease(w, aux) != OK {
		t.Fatal("release")
	}
	if res := <-done; res != OK {
		t.Fatalf("waiter: %v", res)
	}
	if e := s.Waiting(2); len(e) != 0 {
		t.Fatalf("entry kept after the wait: %+v", e)
	}
	// It took the lock after sleeping: the sleepers bit stays, so its
	// release wakes the next.
	if atomic.LoadUint64(w)&BitWaiters == 0 {
		t.Fatal("woken taker dropped the sleepers bit")
	}
	LockRelease(w, aux)
	// A timed-out wait frees its entry too.
	LockAcquire(w, aux, 1, 1, 0)
	wt := s.NewWait(3)
	if res := LockAcquireWait(w, aux, 3, 1, 20*time.Millisecond, wt); res != Busy {
		t.Fatalf("timed wait: %v", res)
	}
	wt.Done(w, Busy)
	if len(s.Waiting(3)) != 0 {
		t.Fatal("entry kept after a timeout")
	}
	s.ClearWaiting(3)
}

// The heir: a starving waiter reserves the free lock for its slot; no other
// slot may take it until the heir took its turn or left.
func TestHeirReservesTheNextTurn(t *testing.T) {
	s := tableSeg(t)
	for _, kind := range []uint8{KindLock, KindRLock} {
		r, _ := s.Alloc(kind, 0, 0)
		w, aux, heir := s.State(r.Off), s.Aux(r.Off), s.Heir(r.Off)
		acq := func(slot uint32, timeout time.Duration, wt *Wait) Result {
			if kind == KindLock {
				return LockAcquireWait(w, aux, slot, int64(slot), timeout, wt)
			}
			return RLockAcquireWait(w, aux, slot, int64(slot), timeout, wt)
		}
		rel := func(slot uint32) Result {
			if kind == KindLock {
				return LockRelease(w, aux)
			}
			return RLockRelease(w, aux, slot, int64(slot))
		}
		if acq(1, 0, &Wait{}) != OK {
			t.Fatal("take")
		}
		// Slot 2 waits past StarveAfter and becomes the heir.
		wt := s.NewWait(2)
		if res := acq(2, 5*StarveAfter, wt); res != Busy {
			t.Fatalf("kind %d: starving wait: %v", kind, res)
		}
		if got := atomic.LoadUint32(heir); got != 2 {
			t.Fatalf("kind %d: heir %d, want 2", kind, got)
		}
		if rel(1) != OK {
			t.Fatal("release")
		}
		// Free, but reserved: slot 3 may not take it.
		if res := acq(3, 0, &Wait{}); res != Busy {
			t.Fatalf("kind %d: another slot took a reserved lock: %v", kind, res)
		}
		// The heir takes it and the reservation is spent.
		if res := acq(2, 0, wt); res != OK {
			t.Fatalf("kind %d: heir: %v", kind, res)
		}
		wt.Done(w, OK)
		if atomic.LoadUint32(heir) != 0 {
			t.Fatal("reservation kept after the heir's turn")
		}
		rel(2)
		// An heir leaving without the lock gives its place up.
		acq(1, 0, &Wait{})
		wt = s.NewWait(2)
		acq(2, 5*StarveAfter, wt)
		wt.Done(w, Busy)
		if atomic.LoadUint32(heir) != 0 {
			t.Fatal("a departed heir kept its reservation")
		}
		rel(1)
		// The daemon drops a dead slot's reservation.
		atomic.StoreUint32(heir, 5)
		if DropHeir(heir, 4) || !DropHeir(heir, 5) || atomic.LoadUint32(heir) != 0 {
			t.Fatal("DropHeir")
		}
	}
}

// Many waiters, each release waking one: every waiter gets the lock in
// turn, none is stranded, and the lock is never held twice.
func TestWakeOneServesEveryWaiter(t *testing.T) {
	s := tableSeg(t)
	r, _ := s.Alloc(KindLock, 0, 0)
	w, aux := s.State(r.Off), s.Aux(r.Off)
	var inside atomic.Int32
	var wg sync.WaitGroup
	const workers, rounds = 6, 200
	for i := 1; i <= workers; i++ {
		wg.Add(1)
		go func(slot uint32) {
			defer wg.Done()
			for j := 0; j < rounds; j++ {
				wt := s.NewWait(slot)
				res := LockAcquireWait(w, aux, slot, int64(slot), 30*time.Second, wt)
				wt.Done(w, res)
				if res != OK {
					t.Errorf("slot %d: %v", slot, res)
					return
				}
				if inside.Add(1) != 1 {
					t.Error("held twice")
				}
				time.Sleep(10 * time.Microsecond)
				inside.Add(-1)
				LockRelease(w, aux)
			}
		}(uint32(i))
	}
	wg.Wait()
	if atomic.LoadUint64(w)&MaskLow != 0 || atomic.LoadUint32(s.Heir(r.Off)) != 0 {
		t.Fatalf("left %x, heir %d", atomic.LoadUint64(w), atomic.LoadUint32(s.Heir(r.Off)))
	}
}

// A Semaphore's last free unit is kept for the heir; with more units free,
// others take them and the reservation stays.
func TestSemaphoreHeirKeepsTheLastUnit(t *testing.T) {
	s := tableSeg(t)
	r, err := s.AllocSemaphore(KindSemaphore, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, heir := s.State(r.Off), s.Heir(r.Off)
	e1, e2, e3 := s.Ledger(r.Off, 1), s.Ledger(r.Off, 2), s.Ledger(r.Off, 3)
	if SemAcquire(w, e1, 1, 0) != OK {
		t.Fatal("take")
	}
	wt := s.NewWait(2)
	if res := SemAcquireWait(w, e2, 2, 5*StarveAfter, wt); res != Busy {
		t.Fatalf("starving wait: %v", res)
	}
	if atomic.LoadUint32(heir) != 2 {
		t.Fatalf("heir %d, want 2", atomic.LoadUint32(heir))
	}
	if SemRelease(w, e1, 1) != OK {
		t.Fatal("release")
	}
	if res := SemAcquire(w, e3, 3, 0); res != Busy {
		t.Fatalf("another slot took the heir's unit: %v", res)
	}
	if res := SemAcquireWait(w, e2, 2, 0, wt); res != OK {
		t.Fatalf("heir: %v", res)
	}
	wt.Done(w, OK)
	if atomic.LoadUint32(heir) != 0 || SemValue(w) != 0 {
		t.Fatalf("after the heir's turn: heir %d, value %d", atomic.LoadUint32(heir), SemValue(w))
	}
	// Two units free and an heir elsewhere: one may still go to someone else.
	if SemRelease(w, e2, 2) != OK {
		t.Fatal("heir's release")
	}
	atomic.StoreUint32(heir, 7)
	atomic.AddUint64(w, 1) // a second free unit (as the daemon's commit of a release makes)
	if res := SemAcquire(w, e3, 3, 0); res != OK {
		t.Fatalf("with two units free: %v", res)
	}
	if atomic.LoadUint32(heir) != 7 {
		t.Fatal("someone else's reservation was spent")
	}
	if res := SemAcquire(w, e1, 1, 0); res != Busy {
		t.Fatalf("the last unit went past the heir: %v", res)
	}
}

// A release while the heir is not asleep (between two looks, or its futex
// wait found the word changed) still wakes a sleeper: the release cleared
// BitWaiters, so a wake-up aimed at the heir alone would leave the other
// sleepers asleep for good.
func TestReleaseWithAnAwakeHeirWakesASleeper(t *testing.T) {
	s := tableSeg(t)
	r, _ := s.Alloc(KindLock, 0, 0)
	w, aux, heir := s.State(r.Off), s.Aux(r.Off), s.Heir(r.Off)
	if LockAcquire(w, aux, 1, 1, 0) != OK {
		t.Fatal("take")
	}
	done := make(chan Result, 1)
	go func() {
		wt := s.NewWait(2)
		res := LockAcquireWait(w, aux, 2, 2, Forever, wt)
		wt.Done(w, res)
		done <- res
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Waiting(2)) == 0 || atomic.LoadUint64(w)&BitWaiters == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never went to sleep")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // asleep on the futex by now
	atomic.StoreUint32(heir, 3)       // slot 3 is the heir, and not asleep
	if LockRelease(w, aux) != OK {
		t.Fatal("release")
	}
	time.Sleep(20 * time.Millisecond)
	atomic.StoreUint32(heir, 0) // the heir left without taking its turn
	select {
	case res := <-done:
		if res != OK {
			t.Fatalf("waiter: %v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sleeper was never woken: the release woke only the (awake) heir")
	}
	LockRelease(w, aux)
}
