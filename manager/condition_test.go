package manager

import (
	"context"
	"testing"
	"time"
)

func TestConditionCancelledWaitDoesNotRetakeTheLock(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s := newSession(t, m)
	lock := create[*Lock](t, m, s, KindLock, "cl", Params{})
	cv := create[*Condition](t, m, s, KindCondition, "cv", Params{Lock: "cl"})
	if ok, err := lock.Acquire(testCtx(t), s, 1, true, Forever); !ok || err != nil {
		t.Fatal(ok, err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	notified, err := cv.Wait(ctx, s, 1, Forever)
	if notified || err == nil {
		t.Fatalf("cancelled wait: notified=%v err=%v", notified, err)
	}
	if lock.Locked() {
		t.Fatal("a cancelled wait reacquired the lock, but its error answer says it does not hold it")
	}
}

func TestConditionNotifyReacquiresRLockDepth(t *testing.T) {
	m := newManager(t, DefaultConfig())
	a, b := newSession(t, m), newSession(t, m)
	cv := create[*Condition](t, m, a, KindCondition, "cv2", Params{})
	ctx := testCtx(t)
	for i := 0; i < 2; i++ { // depth 2 on the private RLock
		if ok, err := cv.Acquire(ctx, a, 7, true, Forever); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	done := make(chan bool, 1)
	go func() {
		ok, err := cv.Wait(ctx, a, 7, time.Second*4)
		done <- ok && err == nil
	}()
	if ok, err := cv.Acquire(ctx, b, 9, true, 4*time.Second); !ok || err != nil { // free only while a waits
		t.Fatal(ok, err)
	}
	if err := cv.Notify(b, 9, 1); err != nil {
		t.Fatal(err)
	}
	if err := cv.Release(b, 9); err != nil {
		t.Fatal(err)
	}
	if !<-done {
		t.Fatal("waiter not notified")
	}
	for i := 0; i < 2; i++ { // both levels are back
		if err := cv.Release(a, 7); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	if err := cv.Release(a, 7); err == nil {
		t.Fatal("a third release succeeded")
	}
}
