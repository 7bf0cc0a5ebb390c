package manager

import (
	"sync"
	"testing"
	"time"
)

func TestHoldEndsAreReportedWithTheirCause(t *testing.T) {
	var mu sync.Mutex
	var ends []HoldEnd
	cfg := DefaultConfig()
	cfg.OnHoldEnd = func(h HoldEnd) { mu.Lock(); ends = append(ends, h); mu.Unlock() }
	m := newManager(t, cfg)
	ctx := testCtx(t)
	a, b := newSession(t, m), newSession(t, m)
	l := create[*Lock](t, m, a, KindLock, "l", Params{})
	r := create[*RLock](t, m, a, KindRLock, "r", Params{})
	sem := create[*Semaphore](t, m, a, KindSemaphore, "s", Params{Value: 2})
	create[*Condition](t, m, a, KindCondition, "c", Params{Lock: "l"})

	if ok, err := l.Acquire(ctx, a, 1, true, Forever); !ok || err != nil {
		t.Fatal(ok, err)
	}
	time.Sleep(20 * time.Millisecond)
	objs, _ := m.Snapshot(0)
	for _, o := range objs {
		if o.Name == "l" && o.HeldFor < 0.02 {
			t.Errorf("status says l held for %v s, want >= 0.02", o.HeldFor)
		}
		if o.Name == "c" && o.HeldFor < 0.02 {
			t.Errorf("status says c (over l) held for %v s, want >= 0.02", o.HeldFor)
		}
		if o.Name == "r" && o.HeldFor != 0 {
			t.Errorf("a free RLock shows held_for %v", o.HeldFor)
		}
	}

	if err := l.Release(a, 1); err != nil {
		t.Fatal(err)
	}
	for range 2 { // reentrant: one hold until the outermost release
		if ok, err := r.Acquire(ctx, b, 7, true, Forever); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	for range 2 {
		if ok, err := sem.Acquire(ctx, b, 7, true, Forever); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	mu.Lock()
	if len(ends) != 1 || ends[0].Kind != KindLock || ends[0].Name != "l" || ends[0].Session != a ||
		ends[0].SessionEnded || ends[0].Held < 20*time.Millisecond {
		t.Fatalf("after a release: %+v", ends)
	}
	mu.Unlock()
	m.CloseSession(b) // b dies holding the RLock (twice) and two units
	mu.Lock()
	defer mu.Unlock()
	if len(ends) != 3 {
		t.Fatalf("after b ended: %d hold ends, want 3 (rlock, semaphore): %+v", len(ends), ends)
	}
	kinds := map[Kind]bool{}
	for _, e := range ends[1:] {
		if !e.SessionEnded || e.Session != b {
			t.Errorf("hold end %+v: want SessionEnded by b", e)
		}
		kinds[e.Kind] = true
	}
	if !kinds[KindRLock] || !kinds[KindSemaphore] {
		t.Errorf("kinds %v, want rlock and semaphore", kinds)
	}
}
