package manager

import (
	"testing"
)

// TestStateWords: the op semantics are visible in the state words, with the
// layout documented in state.go.
func TestStateWords(t *testing.T) {
	m := newManager(t, DefaultConfig())
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)

	l := create[*Lock](t, m, a, KindLock, "wl", Params{})
	l.Acquire(ctx, a, 77, true, Forever)
	if w := l.State().W0.Load(); w != uint64(a.Slot()) || l.State().TID.Load() != 77 {
		t.Fatalf("lock word %#x tid %d", w, l.State().TID.Load())
	}
	w := async(func() (bool, error) { return l.Acquire(ctx, b, 5, true, Forever) })
	waitWaiters(t, l, 1)
	if l.State().W0.Load()&waitersBit == 0 {
		t.Fatal("waiters bit not set with a parked waiter")
	}
	l.Release(a, 77)
	recv(t, w)
	if got := l.State().W0.Load(); got != uint64(b.Slot()) {
		t.Fatalf("after hand-off the word is %#x, want owner %d and no waiters bit", got, b.Slot())
	}

	r := create[*RLock](t, m, a, KindRLock, "wr", Params{})
	for i := 0; i < 3; i++ {
		r.Acquire(ctx, a, 9, true, Forever)
	}
	if slot, tid, depth := r.State().Owner(); slot != a.Slot() || tid != 9 || depth != 3 {
		t.Fatalf("rlock owner %d tid %d depth %d", slot, tid, depth)
	}
	if got := r.State().W0.Load() >> depthShift; got != 3 {
		t.Fatalf("depth bits %d", got)
	}

	s := create[*Semaphore](t, m, a, KindSemaphore, "ws", Params{Value: 5})
	s.Acquire(ctx, a, 0, true, Forever)
	if got := s.State().W0.Load(); got != 4 {
		t.Fatalf("semaphore word %d, want 4", got)
	}
	if _, _, err := m.Create(a, KindSemaphore, "huge", Params{Value: 1 << 40}); !isErr(err, ErrValue) {
		t.Fatalf("a semaphore over 32 bits: %v", err)
	}

	e := create[*Event](t, m, a, KindEvent, "we", Params{})
	e.Set()
	gen1 := e.State().W0.Load() &^ eventFlag
	e.Clear()
	e.Set()
	if !e.IsSet() || e.State().W0.Load()&^eventFlag == gen1 {
		t.Fatal("set must raise the flag and bump the generation")
	}

	v := create[*Value](t, m, a, KindValue, "wv", Params{Typecode: "d", Initial: 1.5})
	if v.Cell() == nil {
		t.Fatal("a 'd' value has no cell")
	}
	// A write to the cell from outside the op code (a fast-path client) is
	// seen by the next read.
	v.Cell().Write(toBits('f', 2.25))
	if got := v.Get(); got != 2.25 {
		t.Fatalf("value after a cell write: %v", got)
	}
	if _, seq := v.Cell().Read(); seq%2 != 0 {
		t.Fatal("odd sequence number at rest")
	}
	o := create[*Value](t, m, a, KindValue, "wo", Params{Typecode: "O", Initial: []byte("x")})
	if o.Cell() != nil {
		t.Fatal("an 'O' value has a cell")
	}
}
