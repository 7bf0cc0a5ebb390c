package statemem

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLockBasics(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindLock, 0, 0)
	w, aux := s.State(r.Off), s.Aux(r.Off)
	if got := LockRelease(w, aux); got != NotOwner {
		t.Fatalf("release of a free lock: %v", got)
	}
	if got := LockAcquire(w, aux, 5, 77, 0); got != OK {
		t.Fatalf("acquire: %v", got)
	}
	if atomic.LoadUint64(w)&MaskLow != 5 || atomic.LoadUint64(aux) != 77 {
		t.Fatalf("word %x aux %d", atomic.LoadUint64(w), atomic.LoadUint64(aux))
	}
	if got := LockAcquire(w, aux, 6, 1, 0); got != Busy {
		t.Fatalf("try on a held lock: %v", got)
	}
	start := time.Now()
	if got := LockAcquire(w, aux, 6, 1, 30*time.Millisecond); got != Busy {
		t.Fatalf("timed acquire on a held lock: %v", got)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("timed out after %v, before 30ms", d)
	}
	if atomic.LoadUint64(w) != 5|BitWaiters {
		t.Fatalf("word after a timed-out wait: %x", atomic.LoadUint64(w))
	}
	if got := LockRelease(w, aux); got != OK { // any session may release a Lock
		t.Fatalf("release: %v", got)
	}
	if atomic.LoadUint64(w) != 0 || atomic.LoadUint64(aux) != 0 {
		t.Fatalf("released word %x aux %d", atomic.LoadUint64(w), atomic.LoadUint64(aux))
	}
}

func TestDaemonBitSendsOpsToTheDaemon(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindLock, 0, 0)
	w, aux := s.State(r.Off), s.Aux(r.Off)
	LockAcquire(w, aux, 5, 1, 0)
	MarkDaemon(w)
	if got := LockRelease(w, aux); got != Daemon {
		t.Fatalf("release with the daemon bit: %v", got)
	}
	if got := LockAcquire(w, aux, 6, 1, Forever); got != Daemon {
		t.Fatalf("acquire with the daemon bit: %v", got)
	}
	if atomic.LoadUint64(w) != 5|BitDaemon || atomic.LoadUint64(aux) != 1 {
		t.Fatalf("a Daemon answer changed the word: %x aux %d", atomic.LoadUint64(w), atomic.LoadUint64(aux))
	}
	UnmarkDaemon(w)
	if got := LockRelease(w, aux); got != OK {
		t.Fatalf("release after the daemon let go: %v", got)
	}

	e, _ := s.Alloc(KindEvent, BitDaemon, 0)
	if got := EventSet(s.State(e.Off)); got != Daemon {
		t.Fatalf("event set with the daemon bit: %v", got)
	}
	EventClear(s.State(e.Off)) // allowed: nobody waits for a clear
}

// A sleeper woken by the daemon letting go of the word retries and takes it.
func TestUnmarkDaemonWakesSleepers(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindLock, 0, 0)
	w, aux := s.State(r.Off), s.Aux(r.Off)
	LockAcquire(w, aux, 5, 1, 0)
	got := make(chan Result, 1)
	go func() { got <- LockAcquire(w, aux, 6, 2, 5*time.Second) }()
	waitFor(t, func() bool { return atomic.LoadUint64(w)&BitWaiters != 0 })
	// The daemon queues a waiter, then hands the lock over to nobody and frees it.
	MarkDaemon(w)
	for {
		x := atomic.LoadUint64(w)
		if atomic.CompareAndSwapUint64(w, x, x&^MaskLow) {
			break
		}
	}
	UnmarkDaemon(w)
	select {
	case res := <-got:
		if res != OK || atomic.LoadUint64(w)&MaskLow != 6 {
			t.Fatalf("sleeper got %v, word %x", res, atomic.LoadUint64(w))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("sleeper not woken")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Mutual exclusion: a plain (non-atomic) counter in the segment, changed
// only under the lock by goroutines acting as different slots.
func TestLockMutualExclusion(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindLock, 0, 0)
	w, aux, counter := s.State(r.Off), s.Aux(r.Off), s.Bound(r.Off)
	const workers, rounds = 4, 20000
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func(slot uint32) {
			defer wg.Done()
			for j := 0; j < rounds; j++ {
				if got := LockAcquire(w, aux, slot, int64(j), Forever); got != OK {
					t.Errorf("acquire: %v", got)
					return
				}
				*counter++
				if got := LockRelease(w, aux); got != OK {
					t.Errorf("release: %v", got)
					return
				}
			}
		}(uint32(i + 1))
	}
	wg.Wait()
	if *counter != workers*rounds {
		t.Fatalf("counter %d, want %d", *counter, workers*rounds)
	}
	if x := atomic.LoadUint64(w); x&MaskLow != 0 {
		t.Fatalf("word %x after all released", x)
	}
}

func TestRLock(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindRLock, 0, 0)
	w, aux := s.State(r.Off), s.Aux(r.Off)
	for i := 0; i < 3; i++ {
		if got := RLockAcquire(w, aux, 2, 10, 0); got != OK {
			t.Fatalf("acquire %d: %v", i, got)
		}
	}
	if x := atomic.LoadUint64(w); x>>DepthShift != 3 || x&MaskLow != 2 {
		t.Fatalf("word %x", x)
	}
	if got := RLockAcquire(w, aux, 2, 11, 0); got != Busy {
		t.Fatalf("another thread of the owner: %v", got)
	}
	if got := RLockAcquire(w, aux, 3, 10, 0); got != Busy {
		t.Fatalf("another session: %v", got)
	}
	if got := RLockRelease(w, aux, 2, 11); got != NotOwner {
		t.Fatalf("release by another thread: %v", got)
	}
	if got := RLockRelease(w, aux, 3, 10); got != NotOwner {
		t.Fatalf("release by another session: %v", got)
	}
	MarkDaemon(w)
	if got := RLockAcquire(w, aux, 2, 10, 0); got != OK {
		t.Fatalf("the owner nests even with the daemon bit: %v", got)
	}
	for i := 0; i < 3; i++ {
		if got := RLockRelease(w, aux, 2, 10); got != OK {
			t.Fatalf("release %d: %v", i, got)
		}
	}
	if got := RLockRelease(w, aux, 2, 10); got != Daemon {
		t.Fatalf("last release with the daemon bit: %v", got)
	}
	if atomic.LoadUint64(aux) != 10 {
		t.Fatal("a Daemon answer must leave the owner's thread id in place")
	}
	UnmarkDaemon(w)
	if got := RLockRelease(w, aux, 2, 10); got != OK {
		t.Fatalf("last release: %v", got)
	}
	if atomic.LoadUint64(w) != 0 || atomic.LoadUint64(aux) != 0 {
		t.Fatal("released RLock not clean")
	}
	if got := RLockRelease(w, aux, 2, 10); got != NotOwner {
		t.Fatalf("release of a free rlock: %v", got)
	}
}

func TestRLockContended(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindRLock, 0, 0)
	w, aux, counter := s.State(r.Off), s.Aux(r.Off), s.Bound(r.Off)
	const workers, rounds = 4, 5000
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func(tid int64) {
			defer wg.Done()
			for j := 0; j < rounds; j++ {
				RLockAcquire(w, aux, 1, tid, Forever) // threads of one session
				RLockAcquire(w, aux, 1, tid, Forever)
				*counter++
				RLockRelease(w, aux, 1, tid)
				if got := RLockRelease(w, aux, 1, tid); got != OK {
					t.Errorf("release: %v", got)
					return
				}
			}
		}(int64(i + 100))
	}
	wg.Wait()
	if *counter != workers*rounds {
		t.Fatalf("counter %d, want %d", *counter, workers*rounds)
	}
}

func TestEvent(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindEvent, 0, 0)
	w := s.State(r.Off)
	if EventIsSet(w) || EventWait(w, 0) {
		t.Fatal("new event is set")
	}
	start := time.Now()
	if EventWait(w, 20*time.Millisecond) || time.Since(start) < 20*time.Millisecond {
		t.Fatal("wait on a clear event did not time out properly")
	}
	// A set followed at once by a clear still releases a waiter.
	atomic.StoreUint64(w, 0) // forget the timed-out waiter's mark
	got := make(chan bool, 1)
	go func() { got <- EventWait(w, 5*time.Second) }()
	waitFor(t, func() bool { return atomic.LoadUint64(w)&BitWaiters != 0 })
	if EventSet(w) != OK {
		t.Fatal("set")
	}
	EventClear(w)
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("waiter missed a set followed by a clear")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken")
	}
	EventSet(w)
	x := atomic.LoadUint64(w)
	EventSet(w) // no change when set
	if atomic.LoadUint64(w) != x || !EventIsSet(w) || !EventWait(w, Forever) {
		t.Fatal("set event")
	}
	// The generation wraps inside its bits.
	atomic.StoreUint64(w, EventGenMax)
	EventSet(w)
	if x := atomic.LoadUint64(w); x != EventFlag {
		t.Fatalf("wrapped generation: %x", x)
	}
}

func TestValue(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindValue, 0, 0)
	a := s.Aux(r.Off)
	ValueStore(a, uint64(127))
	if got := int64(ValueAddInt(a, ClassSigned, 8, 1)); got != -128 {
		t.Fatalf("int8 127+1 = %d", got)
	}
	ValueStore(a, 0)
	if got := ValueAddInt(a, ClassUnsigned, 16, -1); got != 65535 {
		t.Fatalf("uint16 0-1 = %d", got)
	}
	if got := int64(ValueAddInt(a, ClassSigned, 64, -70000)); got != 65535-70000 {
		t.Fatalf("int64 add = %d", got)
	}
	if !ValueCAS(a, ValueLoad(a), 9) || ValueCAS(a, 8, 10) || ValueLoad(a) != 9 {
		t.Fatal("cas")
	}
	ValueStore(a, 0)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 10000; j++ {
				ValueAddInt(a, ClassSigned, 64, 1)
			}
		}()
	}
	wg.Wait()
	if ValueLoad(a) != 40000 {
		t.Fatalf("concurrent adds: %d", ValueLoad(a))
	}
	ValueStore(a, 0)
	ValueAddFloat(a, ClassFloat, 0.1)
	if got := ValueLoad(a); got != 0x3fb99999a0000000 { // float32(0.1) as float64
		t.Fatalf("float32 0.1 bits %x", got)
	}
}
