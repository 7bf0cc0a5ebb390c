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
	t.Helper()
	seg, err := statemem.Create(t.TempDir(), "state", 256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() }) // after the server's shutdown (cleanups run last-in first-out)
	path, srv := serve(t, server.Config{})
	srv.Manager().EnableFastPath(seg)
	return path
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
	got := make(chan bool, 1)
	go func() { ok, _ := sl.AcquireTimeout(ctx, 10*time.Second); got <- ok }()
	time.Sleep(30 * time.Millisecond)
	h.Close()
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("waiter timed out")
		}
	case <-time.After(bound):
		t.Fatal("dead fast holder's lock not released")
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

// TestFastPathLongWaitsJoinTheDaemonQueue: a fast waiter still waiting after
// fastQueueAfter waits in the daemon's queue (which sets the daemon bit), and
// is released from there by a fast client's release or set.
func TestFastPathLongWaitsJoinTheDaemonQueue(t *testing.T) {
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
	time.Sleep(300 * time.Millisecond) // past fastQueueAfter: both wait in the daemon
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := st["waiting"].([]any); len(w) != 2 {
		t.Fatalf("status lists %d waiters, want 2: %v", len(w), st["waiting"])
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
