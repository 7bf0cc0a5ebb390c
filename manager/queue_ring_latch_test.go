package manager

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// A client flips its queue's head word while socket gets run: the queue
// may fail (ErrRingCorrupt), the daemon never panics, and the next queue
// works.
func TestRingHeadFlippedUnderSocketGetsNeverPanics(t *testing.T) {
	m, _ := fastManager(t)
	s := newSession(t, m)
	ctx := testCtx(t)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		q := create[*Queue](t, m, s, KindQueue, "flip", Params{})
		if err := q.Put(ctx, []byte("x"), false, 0); err != nil {
			t.Fatal(err)
		}
		word := ringWords(t, q.Ring())
		bad := q.Ring().Capacity() - 1
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for range 64 {
					atomic.StoreUint64(word(ringOffHead), 0)
					atomic.StoreUint64(word(ringOffHead), bad)
				}
			}
		}()
		for range 1000 {
			if _, err := q.Get(ctx, false, 0); err != nil && !errors.Is(err, ErrEmpty) {
				break // the queue failed: the next one
			}
		}
		close(stop)
		<-done
		m.Delete("flip")
	}
}

// A latch word holding the daemon's own value with no daemon goroutine
// holding it (a client stored it, and may have exited) is taken over.
func TestStrayDaemonLatchIsTakenOver(t *testing.T) {
	m, _ := fastManager(t)
	q := ringQueue(t, m, "q", 0)
	ctx := testCtx(t)
	word := ringWords(t, q.Ring())
	atomic.StoreUint64(word(ringOffLatch), uint64(statemem.LatchDaemon))
	put := async(func() (bool, error) { return true, q.Put(ctx, []byte("x"), true, 100*time.Millisecond) })
	select {
	case r := <-put:
		if r.err != nil {
			t.Fatal(r.err)
		}
	case <-time.After(statemem.LatchWait):
		atomic.StoreUint64(word(ringOffLatch), 0)
		recv(t, put)
		t.Fatal("a put waited on a stray LatchDaemon latch")
	}
	if got, err := q.Get(ctx, false, 0); err != nil || string(got) != "x" {
		t.Fatalf("get: %q, %v", got, err)
	}
}

// A live client that holds a ring's latch and never lets go: the end of a
// session that owes the queue nothing does not wait on it; an op on that
// queue fails after statemem.LatchWait with ErrLimit and nothing done, so
// status, which waits for the queue's op, is held that long at most; other
// queues go on.
func TestLatchHeldByALiveClientBoundsTheWait(t *testing.T) {
	m, _ := fastManager(t)
	a, holder, b := newSession(t, m), newSession(t, m), newSession(t, m)
	if !m.AttachFastPath(holder) || !m.AttachFastPath(b) {
		t.Fatal("attach")
	}
	q := create[*Queue](t, m, a, KindJoinableQueue, "q", Params{})
	other := create[*Queue](t, m, a, KindQueue, "other", Params{})
	ctx := testCtx(t)
	word := ringWords(t, q.Ring())
	atomic.StoreUint64(word(ringOffLatch), uint64(holder.Slot()))
	defer atomic.StoreUint64(word(ringOffLatch), 0)

	ended := async(func() (bool, error) { m.CloseSession(b); return true, nil })
	select {
	case <-ended:
	case <-time.After(time.Second):
		t.Fatal("the end of a session that owes the queue nothing waited on the latch")
	}
	start := time.Now()
	put := async(func() (bool, error) { return true, q.Put(ctx, []byte("x"), false, 0) })
	time.Sleep(50 * time.Millisecond)
	if err := other.Put(ctx, []byte("y"), false, 0); err != nil {
		t.Fatalf("another queue: %v", err)
	}
	snap := async(func() (int, error) { o, _ := m.Snapshot(0); return len(o), nil })
	if r := recv(t, put); !errors.Is(r.err, ErrLimit) {
		t.Fatalf("put behind a held latch: %v", r.err)
	}
	if waited := time.Since(start); waited < statemem.LatchWait || waited > statemem.LatchWait+time.Second {
		t.Fatalf("the put gave up after %v (LatchWait %v)", waited, statemem.LatchWait)
	}
	recv(t, snap)
	atomic.StoreUint64(word(ringOffLatch), 0)
	if n := q.Len(); n != 0 {
		t.Fatalf("the refused put stored %d items", n)
	}
	if err := q.Put(ctx, []byte("x"), false, 0); err != nil {
		t.Fatalf("once the latch is let go: %v", err)
	}
}

// A JoinableQueue's task counts are never given up on a held latch: a join
// behind one fails with ErrLimit instead of reporting the tasks done, and a
// consumer's end waits the latch out and then marks done what it owed.
func TestTaskCountsWaitOutAHeldLatch(t *testing.T) {
	m, _ := fastManager(t)
	prod, cons, holder := newSession(t, m), newSession(t, m), newSession(t, m)
	if !m.AttachFastPath(holder) {
		t.Fatal("attach")
	}
	q := create[*Queue](t, m, prod, KindJoinableQueue, "jq", Params{})
	ctx := testCtx(t)
	if err := q.Put(ctx, []byte("x"), false, 0); err != nil {
		t.Fatal(err)
	}
	g, err := q.GetGrant(ctx, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	q.Owe(&g, cons)
	g.Commit()
	word := ringWords(t, q.Ring())
	atomic.StoreUint64(word(ringOffLatch), uint64(holder.Slot()))
	if ok, err := q.Join(ctx, 10*time.Second); ok || !errors.Is(err, ErrLimit) {
		t.Fatalf("join behind a held latch with a task unfinished: %v, %v", ok, err)
	}
	release := statemem.LatchWait + 500*time.Millisecond
	go func() {
		time.Sleep(release)
		atomic.StoreUint64(word(ringOffLatch), 0)
	}()
	start := time.Now()
	m.CloseSession(cons) // owed the item: it is marked done, once the latch is free
	if waited := time.Since(start); waited < release-100*time.Millisecond {
		t.Fatalf("the consumer's end took %v with the latch held for %v", waited, release)
	}
	if n := q.Unfinished(); n != 0 {
		t.Fatalf("unfinished %d after the consumer's end", n)
	}
	if ok, err := q.Join(ctx, time.Second); !ok || err != nil {
		t.Fatalf("join: %v, %v", ok, err)
	}
}

// Busy tells a queue whose ring latch a client holds, or whose mutex a
// daemon op holds, past the spin, from a free one.
func TestQueueBusy(t *testing.T) {
	m, _ := fastManager(t)
	holder := newSession(t, m)
	if !m.AttachFastPath(holder) {
		t.Fatal("attach")
	}
	q := ringQueue(t, m, "q", 0)
	const spin = 100 * time.Microsecond
	if q.Busy(spin) {
		t.Fatal("a free queue is busy")
	}
	word := ringWords(t, q.Ring())
	atomic.StoreUint64(word(ringOffLatch), uint64(holder.Slot()))
	if !q.Busy(spin) {
		t.Fatal("a queue whose latch a client holds is not busy")
	}
	atomic.StoreUint64(word(ringOffLatch), 0)
	if q.Busy(spin) {
		t.Fatal("a queue whose latch was let go is busy")
	}
	q.mu.Lock()
	busy := q.Busy(spin)
	q.mu.Unlock()
	if !busy {
		t.Fatal("a queue whose mutex is held is not busy")
	}
}
