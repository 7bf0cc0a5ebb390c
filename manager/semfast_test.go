package manager

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// semWords returns a fast-path Semaphore's word and the ledger entry of s.
func semWords(t *testing.T, m *Manager, seg *statemem.Segment, sem *Semaphore, s *Session) (*uint64, *uint32) {
	t.Helper()
	if !m.AttachFastPath(s) {
		t.Fatal("attach")
	}
	r := fastRef(t, m, sem)
	e := seg.Ledger(r.Off, uint32(s.Slot()))
	if e == nil {
		t.Fatalf("slot %d has no ledger entry", s.Slot())
	}
	return seg.State(r.Off), e
}

// Units taken by CAS and through the daemon add up, either side may
// release, and a session's end gives back both kinds of its units.
func TestFastSemaphoreMixed(t *testing.T) {
	m, seg := fastManager(t)
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	sem := create[*Semaphore](t, m, a, KindBoundedSemaphore, "fs", Params{Value: 3})
	w, eb := semWords(t, m, seg, sem, b)

	for i := 0; i < 2; i++ {
		if r := statemem.SemAcquire(w, eb, uint32(b.Slot()), 0); r != statemem.OK {
			t.Fatalf("fast acquire %d: %v", i, r)
		}
	}
	if ok, err := sem.Acquire(ctx, a, 1, false, 0); !ok || err != nil {
		t.Fatalf("daemon acquire: %v %v", ok, err)
	}
	if sem.Value() != 0 || *eb != 2 {
		t.Fatalf("value %d, b's ledger %d", sem.Value(), *eb)
	}
	if r := statemem.SemAcquire(w, eb, uint32(b.Slot()), 0); r != statemem.Busy {
		t.Fatalf("acquire of an empty semaphore: %v", r)
	}
	n := map[Slot]int{}
	sem.heldBy(n)
	if n[a.Slot()] != 1 || n[b.Slot()] != 2 {
		t.Fatalf("held by %v", n)
	}
	if r := statemem.SemRelease(w, eb, uint32(b.Slot())); r != statemem.OK || sem.Value() != 1 {
		t.Fatalf("fast release: %v, value %d", r, sem.Value())
	}
	// b's one unit left: a daemon release by b takes it off b's ledger.
	if err := sem.Release(b, 1); err != nil || *eb != 0 {
		t.Fatalf("daemon release of a CAS unit: %v, ledger %d", err, *eb)
	}
	if r := statemem.SemRelease(w, eb, uint32(b.Slot())); r != statemem.Daemon {
		t.Fatalf("fast release with no units of its own: %v", r)
	}
	if err := sem.Release(a, 1); err != nil {
		t.Fatal(err)
	}
	if err := sem.Release(a, 1); !isErr(err, ErrValue) || sem.Value() != 3 {
		t.Fatalf("bounded over-release: %v, value %d", err, sem.Value())
	}

	// b takes two by CAS, a one through the daemon; b ends.
	statemem.SemAcquire(w, eb, uint32(b.Slot()), 0)
	statemem.SemAcquire(w, eb, uint32(b.Slot()), 0)
	sem.Acquire(ctx, a, 1, false, 0)
	m.CloseSession(b)
	if sem.Value() != 2 || *eb != 0 {
		t.Fatalf("after b's end: value %d, ledger %d", sem.Value(), *eb)
	}
	m.CloseSession(a)
	if sem.Value() != 3 {
		t.Fatalf("after a's end: value %d", sem.Value())
	}
}

// A session killed between the steps of a CAS op leaves the latch set; the
// daemon takes it over when the session ends and recounts what it held,
// whichever step it died at. A daemon op waiting on that latch meanwhile
// does not hang.
func TestFastSemaphoreDeadLatch(t *testing.T) {
	for _, step := range []string{"claimed", "ledger written"} {
		t.Run(step, func(t *testing.T) {
			m, seg := fastManager(t)
			a, b := newSession(t, m), newSession(t, m)
			ctx := testCtx(t)
			sem := create[*Semaphore](t, m, a, KindSemaphore, "fs", Params{Value: 4})
			w, eb := semWords(t, m, seg, sem, b)
			statemem.SemAcquire(w, eb, uint32(b.Slot()), 0) // one unit held for good
			// The next acquire dies after its claim (and perhaps its ledger write).
			x := atomic.LoadUint64(w)
			if !atomic.CompareAndSwapUint64(w, x, x|uint64(b.Slot())<<statemem.LatchShift) {
				t.Fatal("claim")
			}
			if step == "ledger written" {
				atomic.StoreUint32(eb, 2)
			}
			got := async(func() (bool, error) { return sem.Acquire(ctx, a, 1, true, time.Minute) })
			pending(t, got, 20*time.Millisecond) // a live latch is waited out, up to the deadline
			m.CloseSession(b)
			if r := recv(t, got); !r.v || r.err != nil {
				t.Fatalf("daemon acquire after the takeover: %v %v", r.v, r.err)
			}
			if sem.Value() != 3 || *eb != 0 || sem.st.Latched() != 0 {
				t.Fatalf("value %d, ledger %d, latch %d", sem.Value(), *eb, sem.st.Latched())
			}
			if err := sem.Release(a, 1); err != nil || sem.Value() != 4 {
				t.Fatalf("release: %v, value %d", err, sem.Value())
			}
		})
	}
}

// A daemon waiter sets the daemon bit: a CAS release is refused and the
// daemon hands the unit straight to its waiter.
func TestFastSemaphoreDaemonWaiter(t *testing.T) {
	m, seg := fastManager(t)
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	sem := create[*Semaphore](t, m, a, KindSemaphore, "fs", Params{Value: 1})
	w, eb := semWords(t, m, seg, sem, b)
	if r := statemem.SemAcquire(w, eb, uint32(b.Slot()), 0); r != statemem.OK {
		t.Fatal(r)
	}
	got := async(func() (bool, error) { return sem.Acquire(ctx, a, 1, true, Forever) })
	waitWaiters(t, sem, 1)
	if r := statemem.SemAcquire(w, eb, uint32(b.Slot()), 0); r != statemem.Daemon {
		t.Fatalf("fast acquire past a daemon waiter: %v", r)
	}
	if r := statemem.SemRelease(w, eb, uint32(b.Slot())); r != statemem.Daemon {
		t.Fatalf("fast release with a daemon waiter: %v", r)
	}
	if err := sem.Release(b, 1); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, got); !r.v || r.err != nil {
		t.Fatalf("waiter: %v %v", r.v, r.err)
	}
	if *eb != 0 || sem.Value() != 0 || atomic.LoadUint64(w)&statemem.BitDaemon != 0 {
		t.Fatalf("ledger %d value %d word %#x", *eb, sem.Value(), atomic.LoadUint64(w))
	}
}

// Futex sleepers are woken by a release from either side.
func TestFastSemaphoreSleeperWoken(t *testing.T) {
	m, seg := fastManager(t)
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	sem := create[*Semaphore](t, m, a, KindSemaphore, "fs", Params{Value: 0})
	w, eb := semWords(t, m, seg, sem, b)
	got := async(func() (statemem.Result, error) {
		return statemem.SemAcquire(w, eb, uint32(b.Slot()), bound), nil
	})
	pending(t, got, 20*time.Millisecond)
	if err := sem.Release(a, 1); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, got); r.v != statemem.OK || *eb != 1 {
		t.Fatalf("sleeper: %v, ledger %d", r.v, *eb)
	}
	_ = ctx
}

// Fast and daemon clients hammer one Semaphore: never more holders than
// units, and every unit back at the end.
func TestFastSemaphoreStress(t *testing.T) {
	m, seg := fastManager(t)
	ctx := testCtx(t)
	owner := newSession(t, m)
	const units, workers, rounds = 2, 6, 300
	sem := create[*Semaphore](t, m, owner, KindBoundedSemaphore, "fs", Params{Value: units})
	var inside atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for i := 0; i < workers; i++ {
		s := newSession(t, m)
		w, e := semWords(t, m, seg, sem, s)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				fast := (i+r)%2 == 0
				if fast {
					if res := statemem.SemAcquire(w, e, uint32(s.Slot()), statemem.Forever); res == statemem.Daemon {
						fast = false
					} else if res != statemem.OK {
						errs <- "fast acquire " + res.String()
						return
					}
				}
				if !fast {
					if ok, err := sem.Acquire(ctx, s, 1, true, Forever); !ok || err != nil {
						errs <- "daemon acquire failed"
						return
					}
				}
				if n := inside.Add(1); n > units {
					errs <- "more holders than units"
				}
				inside.Add(-1)
				if statemem.SemRelease(w, e, uint32(s.Slot())) != statemem.OK {
					if err := sem.Release(s, 1); err != nil {
						errs <- "release: " + err.Error()
						return
					}
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if sem.Value() != units || sem.total != units || sem.st.Latched() != 0 {
		t.Fatalf("value %d total %d latch %d", sem.Value(), sem.total, sem.st.Latched())
	}
}

// Deleting a Semaphore whose latch a session holds (killed, its end not yet
// run) neither waits for that latch under the manager's lock nor hangs the
// daemon ops waiting on it; the session's end then runs.
func TestFastSemaphoreDeleteWithADeadLatch(t *testing.T) {
	m, seg := fastManager(t)
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	sem := create[*Semaphore](t, m, a, KindSemaphore, "fs", Params{Value: 1})
	w, _ := semWords(t, m, seg, sem, b)
	x := atomic.LoadUint64(w)
	atomic.StoreUint64(w, x|uint64(b.Slot())<<statemem.LatchShift) // b dies mid-op
	waiting := async(func() (bool, error) { return sem.Acquire(ctx, a, 1, true, time.Minute) })
	pending(t, waiting, 20*time.Millisecond)
	deleted := async(func() (bool, error) { return m.Delete("fs"), nil })
	if r := recv(t, deleted); !r.v {
		t.Fatal("delete")
	}
	ended := async(func() (bool, error) { m.CloseSession(b); return true, nil })
	recv(t, ended)
	recv(t, waiting) // either outcome: the object went away under it
	if _, err := m.Lookup(KindSemaphore, "fs"); err == nil {
		t.Fatal("still there")
	}
}
