package manager

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// fastManager is a manager whose objects' words live in a segment, as the
// daemon runs it with the fast path on.
func fastManager(t *testing.T) (*Manager, *statemem.Segment) {
	t.Helper()
	seg, err := statemem.Create(64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	m := newManager(t, DefaultConfig())
	m.EnableFastPath(seg)
	return m, seg
}

func fastRef(t *testing.T, m *Manager, obj Object) statemem.Ref {
	t.Helper()
	r, ok := m.FastRef(obj)
	if !ok {
		t.Fatalf("%s %s has no fast-path slot", obj.Kind(), obj.Name())
	}
	return r
}

// A fast-path holder and a daemon waiter: the waiter's park sets the daemon
// bit, so the holder's CAS release is refused and goes through the daemon,
// which hands the lock straight to its waiter.
func TestFastLockMixedWithDaemonWaiter(t *testing.T) {
	m, seg := fastManager(t)
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	l := create[*Lock](t, m, a, KindLock, "fl", Params{})
	r := fastRef(t, m, l)
	if r.Kind() != statemem.KindLock {
		t.Fatalf("ref kind %d", r.Kind())
	}
	w, aux := seg.State(r.Off), seg.Aux(r.Off)
	if got := statemem.LockAcquire(w, aux, uint32(b.Slot()), 7, 0); got != statemem.OK {
		t.Fatalf("fast acquire: %v", got)
	}
	if !l.Locked() {
		t.Fatal("the daemon does not see the fast-path acquire")
	}
	if st, _ := l.Describe(); st != "locked by slot 2 thread 7" && st != "locked by session 2 thread 7" {
		t.Logf("status: %q", st)
	}
	got := async(func() (bool, error) { return l.Acquire(ctx, a, 1, true, Forever) })
	waitWaiters(t, l, 1)
	if res := statemem.LockRelease(w, aux); res != statemem.Daemon {
		t.Fatalf("fast release with a daemon waiter: %v", res)
	}
	if err := l.Release(b, 7); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, got); !r.v || r.err != nil {
		t.Fatalf("daemon waiter: %v %v", r.v, r.err)
	}
	if owner := l.State().Owner(); owner != a.Slot() {
		t.Fatalf("owner %d, want %d", owner, a.Slot())
	}
	// The queue is empty again: the daemon bit is clear and the fast path works.
	if err := l.Release(a, 1); err != nil {
		t.Fatal(err)
	}
	if res := statemem.LockAcquire(w, aux, uint32(b.Slot()), 7, 0); res != statemem.OK {
		t.Fatalf("fast acquire after the daemon let go: %v", res)
	}
}

// A fast-path sleeper is woken when the daemon frees the lock.
func TestFastSleeperWokenByDaemonRelease(t *testing.T) {
	m, seg := fastManager(t)
	a, b := newSession(t, m), newSession(t, m)
	l := create[*Lock](t, m, a, KindLock, "fs", Params{})
	r := fastRef(t, m, l)
	l.Acquire(testCtx(t), a, 1, true, Forever)
	got := async(func() (statemem.Result, error) {
		return statemem.LockAcquire(seg.State(r.Off), seg.Aux(r.Off), uint32(b.Slot()), 3, 10*time.Second), nil
	})
	deadline := time.Now().Add(bound)
	for atomic.LoadUint64(seg.State(r.Off))&statemem.BitWaiters == 0 {
		if time.Now().After(deadline) {
			t.Fatal("sleeper never marked the word")
		}
		time.Sleep(time.Millisecond)
	}
	if err := l.Release(a, 1); err != nil {
		t.Fatal(err)
	}
	if res := recv(t, got); res.v != statemem.OK || l.State().Owner() != b.Slot() {
		t.Fatalf("sleeper: %v, owner %d", res.v, l.State().Owner())
	}
}

// A session that ends holding fast-path locks (which its hold list does not
// know of) has them released, and the daemon's waiter gets the Lock.
func TestFastHoldsReleasedAtSessionEnd(t *testing.T) {
	m, seg := fastManager(t)
	a := newSession(t, m)
	dead, err := m.OpenSession(nil, 0, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	if !m.AttachFastPath(dead) {
		t.Fatal("attach refused")
	}
	l := create[*Lock](t, m, a, KindLock, "el", Params{})
	rl := create[*RLock](t, m, a, KindRLock, "er", Params{})
	lr, rr := fastRef(t, m, l), fastRef(t, m, rl)
	statemem.LockAcquire(seg.State(lr.Off), seg.Aux(lr.Off), uint32(dead.Slot()), 1, 0)
	for i := 0; i < 3; i++ {
		statemem.RLockAcquire(seg.State(rr.Off), seg.Aux(rr.Off), uint32(dead.Slot()), 1, 0)
	}
	got := async(func() (bool, error) { return l.Acquire(testCtx(t), a, 1, true, Forever) })
	waitWaiters(t, l, 1)
	deadSlot := dead.Slot()
	pin, pinned := m.Slots().Pin(deadSlot)
	if !pinned {
		t.Fatal("slot not in use")
	}
	m.CloseSession(dead)
	if r := recv(t, got); !r.v {
		t.Fatal("waiter did not get the dead session's lock")
	}
	if slot, _, depth := rl.State().Owner(); slot != 0 || depth != 0 {
		t.Fatalf("rlock still owned by %d at depth %d", slot, depth)
	}
	if len(seg.Owned(uint32(deadSlot))) != 0 {
		t.Fatal("words still name the dead slot")
	}
	pin()
}

func TestFastDeleteSendsClientsToTheDaemon(t *testing.T) {
	m, seg := fastManager(t)
	a := newSession(t, m)
	l := create[*Lock](t, m, a, KindLock, "dl", Params{})
	r := fastRef(t, m, l)
	statemem.LockAcquire(seg.State(r.Off), seg.Aux(r.Off), uint32(a.Slot()), 1, 0)
	if !m.Delete("dl") {
		t.Fatal("delete")
	}
	if _, ok := m.FastRef(l); ok {
		t.Fatal("a deleted object keeps its slot")
	}
	if res := statemem.LockAcquire(seg.State(r.Off), seg.Aux(r.Off), uint32(a.Slot()), 1, 0); res != statemem.Daemon {
		t.Fatalf("stale offset: %v", res)
	}
	if !l.Locked() {
		t.Fatal("the deleted lock lost its state when its word went back to Go memory")
	}
	// A new object never sees the old one's state.
	l2 := create[*Lock](t, m, a, KindLock, "dl2", Params{})
	if r2 := fastRef(t, m, l2); r2 == r || l2.Locked() {
		t.Fatalf("reuse: %+v after %+v, locked %v", r2, r, l2.Locked())
	}
}

func TestFastEventAndValue(t *testing.T) {
	m, seg := fastManager(t)
	a := newSession(t, m)
	e := create[*Event](t, m, a, KindEvent, "fe", Params{})
	er := fastRef(t, m, e)
	w := seg.State(er.Off)
	// A fast waiter is woken by the daemon's set.
	got := async(func() (bool, error) { return statemem.EventWait(w, 10*time.Second), nil })
	time.Sleep(20 * time.Millisecond)
	e.Set()
	if r := recv(t, got); !r.v {
		t.Fatal("fast waiter missed the daemon's set")
	}
	e.Clear()
	// A daemon waiter sends the fast set to the daemon.
	dw := async(func() (bool, error) { return e.Wait(testCtx(t), Forever) })
	waitWaiters(t, e, 1)
	if res := statemem.EventSet(w); res != statemem.Daemon {
		t.Fatalf("fast set with a daemon waiter: %v", res)
	}
	e.Set()
	if r := recv(t, dw); !r.v {
		t.Fatal("daemon waiter")
	}
	if !statemem.EventIsSet(w) {
		t.Fatal("fast client does not see the flag")
	}

	v := create[*Value](t, m, a, KindValue, "fv", Params{Typecode: "i", Initial: int64(0)})
	vr := fastRef(t, m, v)
	cell := seg.Aux(vr.Off)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < 5000; i++ {
			statemem.ValueAddInt(cell, statemem.ClassSigned, 32, 1)
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 5000; i++ {
			if _, err := v.Add(int64(1)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	if got := v.Get(); got != int64(10000) {
		t.Fatalf("mixed adds: %v", got)
	}
	statemem.ValueStore(cell, uint64(1<<64-5)) // -5 as a fast client writes it
	if got := v.Get(); got != int64(-5) {
		t.Fatalf("daemon read after a fast store: %v", got)
	}
	if ok, _ := v.CompareAndSet(int64(-5), int64(9)); !ok || int64(statemem.ValueLoad(cell)) != 9 {
		t.Fatal("daemon cas on a shared cell")
	}
	o := create[*Value](t, m, a, KindValue, "fo", Params{Typecode: "O", Initial: []byte("x")})
	if _, ok := m.FastRef(o); ok {
		t.Fatal("an opaque value has no cell")
	}
	s := create[*Semaphore](t, m, a, KindSemaphore, "fsem", Params{Value: 2})
	if sr := fastRef(t, m, s); sr.Kind() != statemem.KindSemaphore || seg.Ledger(sr.Off, 1) == nil {
		t.Fatalf("semaphore ref %+v has no ledger", sr)
	}
	c := create[*Condition](t, m, a, KindCondition, "fc", Params{})
	if cr := fastRef(t, m, c); cr.Kind() != statemem.KindRLock {
		t.Fatalf("condition's lock kind %d", cr.Kind())
	}
}

// Status counts holds from the words: a CAS holder is counted and named by
// its session; a lock taken through the daemon and released by CAS is not
// counted, and its stale hold is dropped (not reported) at the next take.
func TestSnapshotHoldsFromTheWords(t *testing.T) {
	var ends []HoldEnd
	var mu sync.Mutex
	cfg := DefaultConfig()
	cfg.OnHoldEnd = func(h HoldEnd) { mu.Lock(); ends = append(ends, h); mu.Unlock() }
	seg, err := statemem.Create(64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	m := newManager(t, cfg)
	m.EnableFastPath(seg)
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	l := create[*Lock](t, m, a, KindLock, "sh", Params{})
	r := fastRef(t, m, l)
	w, aux := seg.State(r.Off), seg.Aux(r.Off)

	holds := func() map[uint64]int {
		_, ss := m.Snapshot(0)
		n := map[uint64]int{}
		for _, s := range ss {
			n[s.ID] = s.Holds
		}
		return n
	}
	if got := statemem.LockAcquire(w, aux, uint32(b.Slot()), 7, 0); got != statemem.OK {
		t.Fatalf("fast acquire: %v", got)
	}
	if n := holds(); n[b.ID] != 1 || n[a.ID] != 0 {
		t.Fatalf("holds with a CAS holder: %v", n)
	}
	objs, _ := m.Snapshot(0)
	if objs[0].State != "locked by session "+itoa(b.ID)+" thread 7" {
		t.Fatalf("state %q", objs[0].State)
	}
	statemem.LockRelease(w, aux)

	if ok, err := l.Acquire(ctx, a, 1, false, 0); !ok || err != nil { // through the daemon
		t.Fatalf("daemon acquire: %v %v", ok, err)
	}
	statemem.LockRelease(w, aux) // released by CAS: the daemon does not see it
	if n := holds(); n[a.ID] != 0 {
		t.Fatalf("a lock released by CAS still counted: %v", n)
	}
	if ok, _ := l.Acquire(ctx, b, 1, false, 0); !ok {
		t.Fatal("b could not take the free lock")
	}
	if a.Holds() != 0 {
		t.Fatalf("a's stale hold survived the next take: %d", a.Holds())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range ends {
		if e.Session == a {
			t.Fatalf("a stale hold was reported as ended: %+v", e)
		}
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
