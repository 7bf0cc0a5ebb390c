package manager

import (
	"testing"
	"time"
)

func TestSemaphore(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s1, s2 := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)

	t.Run("counts", func(t *testing.T) {
		sem := create[*Semaphore](t, m, s1, KindSemaphore, "s1", Params{Value: 2})
		for i := 0; i < 2; i++ {
			if ok, err := sem.Acquire(ctx, s1, 0, false, Forever); !ok || err != nil {
				t.Fatalf("acquire %d: %v %v", i, ok, err)
			}
		}
		if ok, _ := sem.Acquire(ctx, s1, 0, false, Forever); ok {
			t.Fatal("acquired a third unit of two")
		}
		if ok, err := sem.Acquire(ctx, s1, 0, true, 20*time.Millisecond); ok || err != nil {
			t.Fatalf("timeout: %v %v", ok, err)
		}
		if sem.Value() != 0 || s1.Holds() != 2 {
			t.Fatalf("value %d holds %d", sem.Value(), s1.Holds())
		}
		sem.Release(s1, 0)
		sem.Release(s1, 0)
		if sem.Value() != 2 || s1.Holds() != 0 {
			t.Fatalf("value %d holds %d", sem.Value(), s1.Holds())
		}
		// A plain semaphore may go above its initial value, as threading's.
		if err := sem.Release(s2, 0); err != nil || sem.Value() != 3 {
			t.Fatalf("over-release: %v, value %d", err, sem.Value())
		}
	})

	t.Run("zero and negative", func(t *testing.T) {
		sem := create[*Semaphore](t, m, s1, KindSemaphore, "s2", Params{Value: 0})
		if ok, _ := sem.Acquire(ctx, s1, 0, false, Forever); ok {
			t.Fatal("acquired from a zero semaphore")
		}
		ch := async(func() (bool, error) { return sem.Acquire(ctx, s2, 0, true, Forever) })
		waitWaiters(t, sem, 1)
		sem.Release(s1, 0)
		if r := recv(t, ch); !r.v || r.err != nil {
			t.Fatalf("waiter: %v %v", r.v, r.err)
		}
		if sem.Value() != 0 || s2.Holds() != 1 {
			t.Fatalf("the released unit went to the waiter: value %d holds %d", sem.Value(), s2.Holds())
		}
		sem.Release(s2, 0)
		if _, _, err := m.Create(s1, KindSemaphore, "s3", Params{Value: -1}); !isErr(err, ErrValue) {
			t.Fatalf("negative value: %v", err)
		}
	})

	t.Run("bounded", func(t *testing.T) {
		sem := create[*Semaphore](t, m, s1, KindBoundedSemaphore, "b1", Params{Value: 2})
		if sem.Kind() != KindBoundedSemaphore {
			t.Fatalf("kind %s", sem.Kind())
		}
		if err := sem.Release(s1, 0); !isErr(err, ErrValue) {
			t.Fatalf("release at the initial value: %v", err)
		}
		sem.Acquire(ctx, s1, 0, true, Forever)
		if err := sem.Release(s1, 0); err != nil {
			t.Fatal(err)
		}
		if err := sem.Release(s1, 0); !isErr(err, ErrValue) || sem.Value() != 2 {
			t.Fatalf("over-release: %v value %d", err, sem.Value())
		}
	})

	t.Run("FIFO and no barging", func(t *testing.T) {
		sem := create[*Semaphore](t, m, s1, KindSemaphore, "s4", Params{Value: 1})
		sem.Acquire(ctx, s1, 0, true, Forever)
		const n = 5
		order := make(chan int64, n)
		var chs []<-chan result[bool]
		for i := int64(1); i <= n; i++ {
			chs = append(chs, async(func() (bool, error) {
				ok, err := sem.Acquire(ctx, s2, i, true, Forever)
				order <- i
				return ok, err
			}))
			waitWaiters(t, sem, int(i))
		}
		holder := s1
		for i := int64(1); i <= n; i++ {
			sem.Release(holder, 0) // the one unit goes round
			holder = s2
			recv(t, chs[i-1])
			if got := <-order; got != i {
				t.Fatalf("waiter %d served in turn %d", got, i)
			}
			if sem.Value() != 0 || s1.Holds() != 0 || s2.Holds() != 1 {
				t.Fatalf("value %d holds %d/%d", sem.Value(), s1.Holds(), s2.Holds())
			}
		}
		sem.Release(s2, 0)
		if sem.Value() != 1 || s2.Holds() != 0 {
			t.Fatalf("value %d holds %d", sem.Value(), s2.Holds())
		}
	})
}

// TestSemaphoreReleaseByOtherSession: a unit released by a session that did
// not acquire it must not come back a second time when the acquirer ends.
func TestSemaphoreReleaseByOtherSession(t *testing.T) {
	for _, kind := range []Kind{KindSemaphore, KindBoundedSemaphore} {
		t.Run(string(kind), func(t *testing.T) {
			m := newManager(t, DefaultConfig())
			a, b := newSession(t, m), newSession(t, m)
			ctx := testCtx(t)
			sem := create[*Semaphore](t, m, a, kind, "sem", Params{Value: 1})
			if ok, _ := sem.Acquire(ctx, a, 0, false, Forever); !ok {
				t.Fatal("acquire")
			}
			if err := sem.Release(b, 0); err != nil { // as threading: anyone may release
				t.Fatal(err)
			}
			if sem.Value() != 1 {
				t.Fatalf("value %d after the release", sem.Value())
			}
			m.CloseSession(a)
			if sem.Value() != 1 || a.Holds() != 0 {
				t.Fatalf("value %d after the acquirer ended, want 1 (holds %d)", sem.Value(), a.Holds())
			}
			if kind == KindBoundedSemaphore {
				if err := sem.Release(b, 0); !isErr(err, ErrValue) {
					t.Fatalf("bounded semaphore over-released: %v", err)
				}
			}
		})
	}
}
