package manager

import (
	"context"
	"testing"
	"time"
)

func TestEvent(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s := newSession(t, m)
	ctx := testCtx(t)

	t.Run("a set after since counts, even cleared again", func(t *testing.T) {
		e := create[*Event](t, m, s, KindEvent, "e-since", Params{})
		gen := int64(e.State().W0.Load() & eventGenMax)
		if g, err := e.WaitGrant(ctx, 0, gen); g.OK() || err != nil {
			t.Fatalf("nothing set since %d: %v %v", gen, g.OK(), err)
		}
		e.Set()
		e.Clear()
		if g, err := e.WaitGrant(ctx, 0, gen); !g.OK() || err != nil {
			t.Fatalf("a set since %d not seen: %v %v", gen, g.OK(), err)
		}
		if g, _ := e.WaitGrant(ctx, 0, NoSince); g.OK() {
			t.Fatal("without since a cleared event waits")
		}
		// Parked with since: a later set wakes it as any waiter.
		now := int64(e.State().W0.Load() & eventGenMax)
		done := make(chan bool, 1)
		go func() {
			g, _ := e.WaitGrant(ctx, 10*time.Second, now)
			done <- g.OK()
		}()
		time.Sleep(20 * time.Millisecond)
		e.Set()
		if !<-done {
			t.Fatal("parked waiter not released by a set")
		}
	})

	t.Run("set clear is_set", func(t *testing.T) {
		e := create[*Event](t, m, s, KindEvent, "e1", Params{})
		if e.IsSet() {
			t.Fatal("new event is set")
		}
		e.Set()
		e.Set()
		if !e.IsSet() {
			t.Fatal("not set")
		}
		if ok, err := e.Wait(ctx, Forever); !ok || err != nil {
			t.Fatalf("wait on a set event: %v %v", ok, err)
		}
		e.Clear()
		if e.IsSet() {
			t.Fatal("still set after clear")
		}
		if st, w := e.Describe(); st != "clear" || w != 0 {
			t.Fatalf("describe %q %d", st, w)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		e := create[*Event](t, m, s, KindEvent, "e2", Params{})
		if ok, err := e.Wait(ctx, 0); ok || err != nil {
			t.Fatalf("zero timeout: %v %v", ok, err)
		}
		start := time.Now()
		if ok, err := e.Wait(ctx, 30*time.Millisecond); ok || err != nil {
			t.Fatalf("timeout: %v %v", ok, err)
		}
		if time.Since(start) < 30*time.Millisecond {
			t.Fatal("returned before the timeout")
		}
		waitWaiters(t, e, 0)
	})

	t.Run("every waiter wakes", func(t *testing.T) {
		e := create[*Event](t, m, s, KindEvent, "e3", Params{})
		const n = 10
		var chs []<-chan result[bool]
		for i := 0; i < n; i++ {
			chs = append(chs, async(func() (bool, error) { return e.Wait(ctx, Forever) }))
		}
		waitWaiters(t, e, n)
		pending(t, chs[0], 10*time.Millisecond)
		e.Set()
		for i, ch := range chs {
			if r := recv(t, ch); !r.v || r.err != nil {
				t.Fatalf("waiter %d: %v %v", i, r.v, r.err)
			}
		}
		// Clearing right after set does not un-wake anyone, and a new
		// waiter blocks again.
		e.Clear()
		ch := async(func() (bool, error) { return e.Wait(ctx, Forever) })
		waitWaiters(t, e, 1)
		e.Set()
		if r := recv(t, ch); !r.v {
			t.Fatal("second round waiter not woken")
		}
	})

	t.Run("cancel", func(t *testing.T) {
		e := create[*Event](t, m, s, KindEvent, "e4", Params{})
		cctx, cancel := context.WithCancel(ctx)
		ch := async(func() (bool, error) { return e.Wait(cctx, Forever) })
		waitWaiters(t, e, 1)
		cancel()
		if r := recv(t, ch); r.v || r.err != context.Canceled {
			t.Fatalf("got %v %v", r.v, r.err)
		}
		waitWaiters(t, e, 0)
	})
}
