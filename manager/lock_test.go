package manager

import (
	"context"
	"testing"
	"time"
)

func TestLock(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s1, s2 := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)

	t.Run("acquire and release", func(t *testing.T) {
		l := create[*Lock](t, m, s1, KindLock, "l1", Params{})
		if ok, err := l.Acquire(ctx, s1, 1, true, Forever); !ok || err != nil {
			t.Fatalf("acquire: %v %v", ok, err)
		}
		if !l.Locked() || s1.Holds() != 1 {
			t.Fatalf("locked=%v holds=%d", l.Locked(), s1.Holds())
		}
		if err := l.Release(s1, 1); err != nil {
			t.Fatal(err)
		}
		if l.Locked() || s1.Holds() != 0 {
			t.Fatalf("after release: locked=%v holds=%d", l.Locked(), s1.Holds())
		}
	})

	t.Run("not reentrant", func(t *testing.T) {
		l := create[*Lock](t, m, s1, KindLock, "l2", Params{})
		l.Acquire(ctx, s1, 1, true, Forever)
		if ok, err := l.Acquire(ctx, s1, 1, false, Forever); ok || err != nil {
			t.Fatalf("second non-blocking acquire by the holder: %v %v", ok, err)
		}
		if ok, err := l.Acquire(ctx, s2, 1, false, Forever); ok || err != nil {
			t.Fatalf("non-blocking acquire of a held lock: %v %v", ok, err)
		}
		l.Release(s1, 1)
	})

	t.Run("timeout", func(t *testing.T) {
		l := create[*Lock](t, m, s1, KindLock, "l3", Params{})
		l.Acquire(ctx, s1, 1, true, Forever)
		for _, d := range []time.Duration{0, 30 * time.Millisecond} {
			start := time.Now()
			ok, err := l.Acquire(ctx, s2, 1, true, d)
			if ok || err != nil {
				t.Fatalf("timeout %v: %v %v", d, ok, err)
			}
			if el := time.Since(start); el < d || el > bound {
				t.Fatalf("timeout %v took %v", d, el)
			}
		}
		waitWaiters(t, l, 0)
		l.Release(s1, 1)
	})

	t.Run("release unlocked", func(t *testing.T) {
		l := create[*Lock](t, m, s1, KindLock, "l4", Params{})
		if err := l.Release(s1, 1); !isErr(err, ErrNotOwner) {
			t.Fatalf("got %v, want ErrNotOwner", err)
		}
		l.Acquire(ctx, s1, 1, true, Forever)
		l.Release(s1, 1)
		if err := l.Release(s1, 1); !isErr(err, ErrNotOwner) {
			t.Fatalf("double release: got %v, want ErrNotOwner", err)
		}
	})

	t.Run("any session may release", func(t *testing.T) {
		l := create[*Lock](t, m, s1, KindLock, "l5", Params{})
		l.Acquire(ctx, s1, 1, true, Forever)
		if err := l.Release(s2, 9); err != nil {
			t.Fatalf("release by another session: %v", err)
		}
		if l.Locked() || s1.Holds() != 0 || s2.Holds() != 0 {
			t.Fatalf("locked=%v holds=%d/%d", l.Locked(), s1.Holds(), s2.Holds())
		}
	})

	t.Run("cancelled waiter", func(t *testing.T) {
		l := create[*Lock](t, m, s1, KindLock, "l6", Params{})
		l.Acquire(ctx, s1, 1, true, Forever)
		wctx, cancel := context.WithCancel(ctx)
		ch := async(func() (bool, error) { return l.Acquire(wctx, s2, 1, true, Forever) })
		waitWaiters(t, l, 1)
		cancel()
		if r := recv(t, ch); r.v || r.err != context.Canceled {
			t.Fatalf("got %v %v, want context.Canceled", r.v, r.err)
		}
		waitWaiters(t, l, 0)
		l.Release(s1, 1)
		if l.Locked() {
			t.Fatal("the cancelled waiter got the lock")
		}
	})

	t.Run("FIFO", func(t *testing.T) {
		l := create[*Lock](t, m, s1, KindLock, "l7", Params{})
		l.Acquire(ctx, s1, 0, true, Forever)
		const n = 8
		order := make(chan int64, n)
		var chs []<-chan result[bool]
		for i := int64(1); i <= n; i++ {
			chs = append(chs, async(func() (bool, error) {
				ok, err := l.Acquire(ctx, s2, i, true, Forever)
				order <- i
				return ok, err
			}))
			waitWaiters(t, l, int(i)) // queue them in a known order
		}
		for i := int64(1); i <= n; i++ {
			l.Release(s1, 0)
			if r := recv(t, chs[i-1]); !r.v || r.err != nil {
				t.Fatalf("waiter %d: %v %v", i, r.v, r.err)
			}
			if got := <-order; got != i {
				t.Fatalf("waiter %d got the lock in turn %d", got, i)
			}
		}
		l.Release(s2, n)
	})
}

func TestRLock(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s1, s2 := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)

	t.Run("nesting", func(t *testing.T) {
		r := create[*RLock](t, m, s1, KindRLock, "r1", Params{})
		for i := 0; i < 3; i++ {
			if ok, err := r.Acquire(ctx, s1, 7, false, Forever); !ok || err != nil {
				t.Fatalf("acquire %d: %v %v", i, ok, err)
			}
		}
		if st, _ := r.Describe(); st != "locked by session 1 thread 7, depth 3" {
			t.Fatalf("state %q", st)
		}
		if s1.Holds() != 1 {
			t.Fatalf("holds %d, want 1 for a nested rlock", s1.Holds())
		}
		for i := 0; i < 3; i++ {
			if err := r.Release(s1, 7); err != nil {
				t.Fatalf("release %d: %v", i, err)
			}
		}
		if err := r.Release(s1, 7); !isErr(err, ErrNotOwner) {
			t.Fatalf("release of an unheld rlock: %v", err)
		}
		if s1.Holds() != 0 {
			t.Fatalf("holds %d after the last release", s1.Holds())
		}
	})

	t.Run("owner is session and tid", func(t *testing.T) {
		r := create[*RLock](t, m, s1, KindRLock, "r2", Params{})
		r.Acquire(ctx, s1, 1, true, Forever)
		if ok, _ := r.Acquire(ctx, s1, 2, false, Forever); ok {
			t.Fatal("another thread of the owning session nested")
		}
		if ok, _ := r.Acquire(ctx, s2, 1, false, Forever); ok {
			t.Fatal("another session with the same tid nested")
		}
		for _, o := range []struct {
			s   *Session
			tid int64
		}{{s1, 2}, {s2, 1}, {s2, 2}} {
			if err := r.Release(o.s, o.tid); !isErr(err, ErrNotOwner) {
				t.Fatalf("release by session %d tid %d: %v", o.s.ID, o.tid, err)
			}
		}
		ch := async(func() (bool, error) { return r.Acquire(ctx, s2, 5, true, Forever) })
		waitWaiters(t, r, 1)
		r.Release(s1, 1)
		if res := recv(t, ch); !res.v || res.err != nil {
			t.Fatalf("waiter: %v %v", res.v, res.err)
		}
		if ok, _ := r.Acquire(ctx, s2, 5, false, Forever); !ok {
			t.Fatal("the new owner cannot nest")
		}
		r.Release(s2, 5)
		r.Release(s2, 5)
	})

	t.Run("timeout and cancel", func(t *testing.T) {
		r := create[*RLock](t, m, s1, KindRLock, "r3", Params{})
		r.Acquire(ctx, s1, 1, true, Forever)
		if ok, err := r.Acquire(ctx, s2, 1, true, 20*time.Millisecond); ok || err != nil {
			t.Fatalf("timeout: %v %v", ok, err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if ok, err := r.Acquire(cctx, s2, 1, true, Forever); ok || err != context.Canceled {
			t.Fatalf("cancelled: %v %v", ok, err)
		}
		r.Release(s1, 1)
	})
}

// Wakeups counts a waiter woken by another goroutine's release (its
// goroutine made runnable), which the server's event loops read, and not
// an acquire that takes a free lock.
func TestWakeupsCountsAGrantedWaiter(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s1, s2 := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	l := create[*Lock](t, m, s1, KindLock, "woken", Params{})
	before := Wakeups()
	if ok, err := l.Acquire(ctx, s1, 1, true, Forever); !ok || err != nil {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if Wakeups() != before {
		t.Fatal("an acquire of a free lock counted as a wake-up")
	}
	got := make(chan error, 1)
	go func() {
		ok, err := l.Acquire(ctx, s2, 2, true, Forever)
		if err == nil && !ok {
			err = context.DeadlineExceeded
		}
		got <- err
	}()
	eventually(t, "the second acquire parks", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.waiters.len() == 1
	})
	if err := l.Release(s1, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := Wakeups() - before; n < 1 {
		t.Fatalf("the granted waiter was not counted (%d)", n)
	}
}
