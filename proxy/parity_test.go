package proxy_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
)

func parityDial(t *testing.T) func() *proxy.Client {
	path, _ := serve(t, server.Config{})
	return func() *proxy.Client { return dialC(t, path) }
}

func TestParityHandles(t *testing.T) {
	dial := parityDial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Barrier with an action run by exactly one party, before anyone passes.
	var ran sync.WaitGroup
	ran.Add(1)
	actions := 0
	var mu sync.Mutex
	action := func() error { mu.Lock(); actions++; mu.Unlock(); ran.Done(); return nil }
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		b, err := dial().Barrier(ctx, "bar", 3, action)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.Wait(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if actions != 1 {
		t.Fatalf("action ran %d times, want 1", actions)
	}

	// JoinableQueue: Join returns once a consumer in another client is done.
	c1, c2 := dial(), dial()
	jq1, _ := c1.JoinableQueue(ctx, "jq", 0)
	jq2, _ := c2.JoinableQueue(ctx, "jq", 0)
	if err := jq1.Put(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	go func() {
		if _, err := jq2.Get(ctx); err == nil {
			_ = jq2.TaskDone(ctx)
		}
	}()
	if err := jq1.Join(ctx); err != nil {
		t.Fatalf("join: %v", err)
	}

	// Dict and List.
	d, _ := c1.Dict(ctx, "d")
	if err := d.Update(ctx, map[string]any{"a": "1", "b": "2"}); err != nil {
		t.Fatal(err)
	}
	if v, err := d.Get(ctx, "b"); err != nil || v != "2" {
		t.Fatalf("get b: %q %v", v, err)
	}
	if _, err := d.Get(ctx, "zz"); err == nil {
		t.Fatal("missing key: no error")
	}
	l, _ := c2.List(ctx, "l")
	_ = l.Append(ctx, "x")
	_ = l.Append(ctx, "y")
	if v, err := l.Get(ctx, -1); err != nil || v != "y" {
		t.Fatalf("list[-1]: %q %v", v, err)
	}

	// Condition: a notify from one client wakes a waiter in another.
	cvA, _ := c1.Condition(ctx, "cv", "")
	cvB, _ := c2.Condition(ctx, "cv", "")
	if err := cvA.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		defer wcancel()
		ok, err := cvA.Wait(wctx)
		if err == nil && !ok {
			err = errors.New("wait timed out")
		}
		woke <- err
	}()
	if err := cvB.Acquire(ctx); err != nil { // possible only once A waits
		t.Fatal(err)
	}
	if err := cvB.Notify(ctx, 1); err != nil {
		t.Fatalf("notify: %v", err)
	}
	if err := cvB.Release(ctx); err != nil {
		t.Fatalf("release after notify: %v", err)
	}
	if err := <-woke; err != nil {
		t.Fatalf("condition wait: %v", err)
	}
	if err := cvA.Release(ctx); err != nil { // a successful wait holds the lock again
		t.Fatalf("release after wait: %v", err)
	}
}
