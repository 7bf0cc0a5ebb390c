package proxy_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
	"github.com/syncmgr/syncmgr/statemem"
)

// serveFast starts a server whose manager keeps its words in a segment.
func serveFast(t *testing.T) string {
	path, _ := serveFastSeg(t)
	return path
}

func serveFastSeg(t *testing.T) (string, *statemem.Segment) {
	t.Helper()
	seg, err := statemem.Create(256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() }) // after the server's shutdown (cleanups run last-in first-out)
	path, srv := serve(t, server.Config{})
	srv.Manager().EnableFastPath(seg)
	return path, seg
}

// casUnits sums the units the ledgers of seg's Semaphores count.
func casUnits(seg *statemem.Segment) int {
	n := 0
	for off := uint32(statemem.SlotSize); seg.Valid(off); off += statemem.SlotSize {
		if k := uint8(*seg.Tag(off)); k == statemem.KindSemaphore || k == statemem.KindBoundedSemaphore {
			for _, e := range seg.LedgerEntries(off) {
				n += int(e)
			}
		}
	}
	return n
}

// Semaphore units taken by CAS and over the socket exclude each other, the
// daemon's errors stay its own, and a fast client's end gives its units back.
func TestFastPathGoSemaphore(t *testing.T) {
	path, seg := serveFastSeg(t)
	ctx := context.Background()
	a := dialC(t, path, proxy.WithFastPath())
	sock := dialC(t, path)
	s, err := a.BoundedSemaphore(ctx, "g-sem", 2)
	if err != nil {
		t.Fatal(err)
	}
	ss, _ := sock.BoundedSemaphore(ctx, "g-sem", 2)
	if ok, _ := s.TryAcquire(ctx); !ok || casUnits(seg) != 1 {
		t.Fatalf("fast try: %v, CAS units %d", ok, casUnits(seg))
	}
	if err := s.Release(ctx); err != nil || casUnits(seg) != 0 {
		t.Fatalf("fast release: %v, CAS units %d", err, casUnits(seg))
	}
	if err := s.Release(ctx); err == nil {
		t.Fatal("over-release of a BoundedSemaphore")
	}

	var mu sync.Mutex // guards cur (holders now) and top (most at once)
	cur, top := 0, 0
	var wg sync.WaitGroup
	work := func(m *proxy.Mutex) {
		defer wg.Done()
		for i := 0; i < 200; i++ {
			if err := m.Acquire(ctx); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			cur++
			top = max(top, cur)
			mu.Unlock()
			time.Sleep(10 * time.Microsecond)
			mu.Lock()
			cur--
			mu.Unlock()
			if err := m.Release(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}
	wg.Add(4)
	go work(s)
	go work(s)
	go work(ss)
	go work(ss)
	wg.Wait()
	if top > 2 || top < 1 {
		t.Fatalf("peak holders %d", top)
	}

	// A fast client holding both units by CAS closes: a socket waiter gets one.
	h := dialC(t, path, proxy.WithFastPath())
	hs, _ := h.BoundedSemaphore(ctx, "g-sem", 2)
	for i := 0; i < 2; i++ {
		if ok, _ := hs.TryAcquire(ctx); !ok {
			t.Fatal("take both units")
		}
	}
	if casUnits(seg) != 2 {
		t.Fatalf("CAS units %d", casUnits(seg))
	}
	acquireAfterClose(t, ss, h, "dead fast holder's units not given back")
	if ok, _ := s.TryAcquire(ctx); !ok || casUnits(seg) != 1 {
		t.Fatalf("the other unit: %v, CAS units %d", ok, casUnits(seg))
	}
}

func TestFastPathGoClient(t *testing.T) {
	path := serveFast(t)
	ctx := context.Background()
	a := dialC(t, path, proxy.WithFastPath())
	if ok, why := a.FastPath(); !ok {
		t.Fatalf("fast path off: %s", why)
	}
	sock := dialC(t, path) // a socket-path client of the same objects
	if ok, _ := sock.FastPath(); ok {
		t.Fatal("fast path on without WithFastPath")
	}

	// Mutual exclusion between fast goroutines (distinct owners of an RLock)
	// and a socket client, on a counter kept in a Value.
	rl, err := a.RLock(ctx, "g-rl")
	if err != nil {
		t.Fatal(err)
	}
	srl, _ := sock.RLock(ctx, "g-rl")
	n, _ := a.Value(ctx, "g-n", "q", int64(0))
	var wg sync.WaitGroup
	bump := func(m *proxy.Mutex) {
		defer wg.Done()
		for i := 0; i < 200; i++ {
			if err := m.Acquire(ctx); err != nil {
				t.Error(err)
				return
			}
			if err := m.Acquire(ctx); err != nil { // nests
				t.Error(err)
				return
			}
			v, err := n.Get(ctx)
			if err == nil {
				err = n.Set(ctx, v.(int64)+1)
			}
			if err != nil {
				t.Error(err)
			}
			m.Release(ctx)
			if err := m.Release(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}
	wg.Add(3)
	go bump(rl.WithOwner(1))
	go bump(rl.WithOwner(2))
	go bump(srl.WithOwner(1))
	wg.Wait()
	if v, _ := n.Get(ctx); v != int64(600) {
		t.Fatalf("counter %v, want 600", v)
	}

	// Try, timeout and the daemon's error for a release of a free lock.
	l, _ := a.Lock(ctx, "g-l")
	if ok, _ := l.TryAcquire(ctx); !ok {
		t.Fatal("try on a free lock")
	}
	if ok, _ := l.TryAcquire(ctx); ok {
		t.Fatal("try on a held lock")
	}
	start := time.Now()
	if ok, err := l.AcquireTimeout(ctx, 50*time.Millisecond); ok || err != nil || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("timed acquire: %v %v after %v", ok, err, time.Since(start))
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(30*time.Millisecond, cancel)
	if err := l.Acquire(cctx); err == nil {
		t.Fatal("a cancelled acquire succeeded")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err == nil {
		t.Fatal("release of a free lock")
	}

	// Events across a fast and a socket client.
	ev, _ := a.Event(ctx, "g-ev")
	sev, _ := sock.Event(ctx, "g-ev")
	done := make(chan error, 1)
	go func() { done <- ev.Wait(ctx) }()
	time.Sleep(30 * time.Millisecond)
	if err := sev.Set(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(bound):
		t.Fatal("fast waiter missed a socket set")
	}
	if set, _ := ev.IsSet(ctx); !set {
		t.Fatal("is_set")
	}
	ev.Clear(ctx)
	if set, _ := sev.IsSet(ctx); set {
		t.Fatal("socket client sees a fast clear late")
	}

	// A fast holder whose connection closes: its session ends, the daemon
	// releases the word, a waiting socket client gets the lock.
	h := dialC(t, path, proxy.WithFastPath())
	hl, _ := h.Lock(ctx, "g-dead")
	if err := hl.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	sl, _ := sock.Lock(ctx, "g-dead")
	acquireAfterClose(t, sl, h, "dead fast holder's lock not released")
}

// acquireAfterClose starts waiter waiting, closes holder (ending its session,
// so the daemon gives back what it held) and checks that the waiter gets it.
func acquireAfterClose(t *testing.T, waiter *proxy.Mutex, holder *proxy.Client, stuck string) {
	t.Helper()
	got := make(chan bool, 1)
	go func() { ok, _ := waiter.AcquireTimeout(context.Background(), 10*time.Second); got <- ok }()
	time.Sleep(30 * time.Millisecond)
	holder.Close()
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("waiter timed out")
		}
	case <-time.After(bound):
		t.Fatal(stuck)
	}
}

func TestFastPathFallsBack(t *testing.T) {
	path := serveFast(t)
	t.Setenv("SYNCMGR_FASTPATH_BOOT_ID", "another-host")
	c := dialC(t, path, proxy.WithFastPath())
	if ok, why := c.FastPath(); ok || why == "" {
		t.Fatalf("another boot id: %v %q", ok, why)
	}
	l, _ := c.Lock(context.Background(), "fb")
	if err := l.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SYNCMGR_FASTPATH_BOOT_ID", "")
	t.Setenv("SYNCMGR_FASTPATH", "0")
	if ok, _ := dialC(t, path, proxy.WithFastPath()).FastPath(); ok {
		t.Fatal("SYNCMGR_FASTPATH=0 ignored")
	}
}

// TestFastPathLongWaitsStayOnTheFutex: fast waiters sleep on the futex for
// their whole wait (the daemon bit stays clear), status lists them from
// their waiter records, and a fast client's release or set frees them.
func TestFastPathLongWaitsStayOnTheFutex(t *testing.T) {
	path := serveFast(t)
	ctx := context.Background()
	a := dialC(t, path, proxy.WithFastPath())
	b := dialC(t, path, proxy.WithFastPath())
	l, _ := a.Lock(ctx, "q-l")
	bl, _ := b.Lock(ctx, "q-l")
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- bl.Acquire(ctx) }()
	ev, _ := a.Event(ctx, "q-ev")
	bev, _ := b.Event(ctx, "q-ev")
	set := make(chan bool, 1)
	go func() { ok, _ := bev.WaitTimeout(ctx, 10*time.Second); set <- ok }()
	time.Sleep(300 * time.Millisecond) // past the old 50 ms limit on the futex
	deadline := time.Now().Add(bound)
	for {
		st, err := a.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if w, _ := st["waiting"].([]any); len(w) == 2 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("status lists %d waiters, want 2: %v", len(w), st["waiting"])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ev.Set(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(bound):
		t.Fatal("queued waiter never got the lock")
	}
	select {
	case ok := <-set:
		if !ok {
			t.Fatal("queued event waiter timed out")
		}
	case <-time.After(bound):
		t.Fatal("queued event waiter never woke")
	}
	if ok, _ := l.TryAcquire(ctx); ok {
		t.Fatal("the lock should be b's")
	}
}

// A fast-path client's create carries the object's word: the object is
// used on the fast path with no fastpath_ref round trip.
func TestFastPathCreateCarriesTheWord(t *testing.T) {
	rs := serveRing(t)
	ctx := context.Background()
	c := dialC(t, rs.path, proxy.WithFastPath())
	if ok, why := c.FastPath(); !ok {
		t.Fatalf("fast path off: %s", why)
	}
	mu, err := c.Lock(ctx, "cw")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := mu.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		if err := mu.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The daemon counts a request after its reply: a ping on the same
	// connection is answered after every earlier request was counted.
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rs.opsOf(t, "fastpath_ref", "server"); n != 0 {
		t.Fatalf("%d fastpath_ref requests for a created lock", n)
	}
	if n := rs.opsOf(t, "acquire", "lock") + rs.opsOf(t, "release", "lock"); n != 0 {
		t.Fatalf("%d acquire/release requests: the lock is not on the fast path", n)
	}
}
