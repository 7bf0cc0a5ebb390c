package manager

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestGrantUndo: undoing each op's grant restores the state from before
// the op, and hands what it gave back to the next waiter.
func TestGrantUndo(t *testing.T) {
	m := newManager(t, DefaultConfig())
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)

	t.Run("lock", func(t *testing.T) {
		l := create[*Lock](t, m, a, KindLock, "gl", Params{})
		g, err := l.AcquireGrant(ctx, a, 1, true, Forever)
		if err != nil || !g.OK() || !l.Locked() || l.State().Owner() != a.Slot() {
			t.Fatalf("acquire: %v ok=%v owner=%d", err, g.OK(), l.State().Owner())
		}
		w := async(func() (bool, error) { return l.Acquire(ctx, b, 2, true, Forever) })
		waitWaiters(t, l, 1)
		g.Undo()
		if res := recv(t, w); !res.v || res.err != nil || l.State().Owner() != b.Slot() {
			t.Fatalf("waiter after undo: %v %v owner %d", res.v, res.err, l.State().Owner())
		}
		g.Undo() // a second undo is a no-op: it must not release b's hold
		if l.State().Owner() != b.Slot() {
			t.Fatal("second undo released another session's lock")
		}
		if err := l.Release(b, 2); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("rlock", func(t *testing.T) {
		r := create[*RLock](t, m, a, KindRLock, "gr", Params{})
		r.Acquire(ctx, a, 1, true, Forever)
		g, _ := r.AcquireGrant(ctx, a, 1, true, Forever) // nested
		g.Undo()
		if _, _, depth := r.State().Owner(); depth != 1 {
			t.Fatalf("depth after undoing a nested acquire: %d, want 1", depth)
		}
		if err := r.Release(a, 1); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("semaphore", func(t *testing.T) {
		s := create[*Semaphore](t, m, a, KindBoundedSemaphore, "gs", Params{Value: 1})
		g, _ := s.AcquireGrant(ctx, a, 1, false, 0)
		if !g.OK() || s.Value() != 0 || a.Holds() != 1 {
			t.Fatalf("acquire: ok=%v value=%d holds=%d", g.OK(), s.Value(), a.Holds())
		}
		g.Undo()
		if s.Value() != 1 || a.Holds() != 0 {
			t.Fatalf("after undo: value %d holds %d", s.Value(), a.Holds())
		}
	})
	t.Run("queue get", func(t *testing.T) {
		q := create[*Queue](t, m, a, KindQueue, "gq", Params{})
		for _, s := range []string{"one", "two"} {
			if err := q.Put(ctx, []byte(s), false, 0); err != nil {
				t.Fatal(err)
			}
		}
		g, err := q.GetGrant(ctx, false, 0)
		if err != nil || string(g.Item()) != "one" {
			t.Fatalf("get: %q %v", g.Item(), err)
		}
		g.Undo()
		if item, _ := q.Get(ctx, false, 0); string(item) != "one" {
			t.Fatalf("after undo the first item is %q, want one", item)
		}
		// Undo of a parked get hands the item to the next getter.
		q.Get(ctx, false, 0)
		w := async(func() ([]byte, error) { return q.Get(ctx, true, Forever) })
		waitWaiters(t, q, 1)
		g = Grant{obj: q, item: []byte("back"), ok: true}
		g.Undo()
		if res := recv(t, w); !bytes.Equal(res.v, []byte("back")) {
			t.Fatalf("waiting getter got %q", res.v)
		}
	})
	t.Run("condition wait", func(t *testing.T) {
		c := create[*Condition](t, m, a, KindCondition, "gc", Params{})
		c.Acquire(ctx, a, 1, true, Forever)
		other := async(func() (bool, error) {
			c.Acquire(ctx, b, 2, true, Forever)
			defer c.Release(b, 2)
			return c.Wait(ctx, b, 2, 5*time.Second)
		})
		// a waits first, then b; a notify wakes a, whose grant is undone:
		// the notification passes to b and a does not hold the lock.
		wa := async(func() (Grant, error) { return c.WaitGrant(ctx, a, 1, 5*time.Second) })
		waitWaiters(t, c, 2)
		c.Acquire(ctx, a, 3, true, Forever) // a different thread of a: the RLock is free
		if err := c.Notify(a, 3, 1); err != nil {
			t.Fatal(err)
		}
		c.Release(a, 3)
		ga := recv(t, wa)
		if ga.err != nil || !ga.v.OK() || !c.lock.ownedBy(a, 1) {
			t.Fatalf("a's wait: %v ok=%v", ga.err, ga.v.OK())
		}
		ga.v.Undo()
		if c.lock.ownedBy(a, 1) {
			t.Fatal("undone wait still holds the lock")
		}
		if res := recv(t, other); !res.v || res.err != nil {
			t.Fatalf("b was not passed the notification: %v %v", res.v, res.err)
		}
	})
	t.Run("barrier action", func(t *testing.T) {
		br := create[*Barrier](t, m, a, KindBarrier, "gb", Params{Parties: 1, Action: true, Timeout: Forever})
		g, err := br.WaitGrant(ctx, a, -1)
		if err != nil || !g.RunAction() {
			t.Fatalf("wait: %v action=%v", err, g.RunAction())
		}
		g.Undo()
		if !br.Broken() {
			t.Fatal("an undone action duty must break the barrier")
		}
	})
	t.Run("zero grant", func(t *testing.T) {
		var g Grant
		g.Undo()
		g.Commit()
		if g.OK() {
			t.Fatal("zero grant is OK")
		}
	})
}

// TestCancelledWaiterTakesNothing: a waiter whose context ends takes
// nothing, and a grant that raced in is kept by it (the transport then
// delivers or undoes it).
func TestCancelledWaiterTakesNothing(t *testing.T) {
	m := newManager(t, DefaultConfig())
	a, b := newSession(t, m), newSession(t, m)
	l := create[*Lock](t, m, a, KindLock, "cl", Params{})
	l.Acquire(context.Background(), a, 1, true, Forever)
	ctx, cancel := context.WithCancel(context.Background())
	w := async(func() (Grant, error) { return l.AcquireGrant(ctx, b, 2, true, Forever) })
	waitWaiters(t, l, 1)
	cancel()
	res := recv(t, w)
	if res.err == nil || res.v.OK() {
		t.Fatalf("cancelled waiter: %v ok=%v", res.err, res.v.OK())
	}
	if l.State().W0.Load()&waitersBit != 0 {
		t.Fatal("waiters bit still set after the only waiter left")
	}
	if err := l.Release(a, 1); err != nil || l.Locked() {
		t.Fatalf("release: %v locked=%v", err, l.Locked())
	}
}

// TestHotPathAllocations: an uncontended acquire (with its grant) and
// release, and Event.IsSet, allocate nothing.
func TestHotPathAllocations(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s := newSession(t, m)
	l := create[*Lock](t, m, s, KindLock, "al", Params{})
	e := create[*Event](t, m, s, KindEvent, "ae", Params{})
	ctx := context.Background()
	n := testing.AllocsPerRun(1000, func() {
		g, _ := l.AcquireGrant(ctx, s, 1, true, Forever)
		g.Commit()
		_ = l.Release(s, 1)
		_ = e.IsSet()
	})
	if n != 0 {
		t.Fatalf("%v allocations per acquire/release/is_set", n)
	}
}
