package manager

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Forever is the timeout that never expires.
const Forever time.Duration = -1

// waiter is one parked caller. Fields other than ready are written under the
// owning object's mutex before ready is closed.
type waiter struct {
	ready chan struct{}
	elem  *list.Element // nil once granted, failed or removed
	err   error         // set when failed
	sess  *Session
	tid   int64
	item  []byte   // queue item: to put (putter) or got (getter)
	items [][]byte // queue batch to put (a put_many putter; item is nil)
	n     int64    // barrier: the party's index
}

func newWaiter(s *Session, tid int64) *waiter {
	return &waiter{ready: make(chan struct{}), sess: s, tid: tid}
}

// waitQueue is a FIFO of waiters; every method needs the object's mutex.
// When word is set, its waiters bit says whether the queue is non-empty,
// so that a fast-path client knows to go through the daemon.
type waitQueue struct {
	l    list.List
	word *Word
}

func (q *waitQueue) push(w *waiter) {
	w.elem = q.l.PushBack(w)
	if q.word != nil && q.l.Len() == 1 {
		q.word.setWaiters(true)
	}
}
func (q *waitQueue) len() int { return q.l.Len() }

func (q *waitQueue) front() *waiter {
	if e := q.l.Front(); e != nil {
		return e.Value.(*waiter)
	}
	return nil
}

// remove takes w off the queue; false means it was granted or failed first.
func (q *waitQueue) remove(w *waiter) bool {
	if w.elem == nil {
		return false
	}
	q.l.Remove(w.elem)
	w.elem = nil
	if q.word != nil && q.l.Len() == 0 {
		q.word.setWaiters(false)
	}
	return true
}

// grant removes w and wakes it with success.
func (q *waitQueue) grant(w *waiter) {
	q.remove(w)
	close(w.ready)
	wakeups.Add(1)
}

// failAll wakes every waiter with err.
func (q *waitQueue) failAll(err error) {
	for w := q.front(); w != nil; w = q.front() {
		q.remove(w)
		w.err = err
		close(w.ready)
		wakeups.Add(1)
	}
}

// wakeups counts the parked waiters woken by another goroutine (Wakeups).
var wakeups atomic.Uint64

// Wakeups returns how many parked waiters have been woken by another
// goroutine so far (granted, or failed by a delete or a shutdown), in every
// Manager of the process. The server's event loops compare it across a
// batch of requests: a change means the batch made goroutines runnable.
func Wakeups() uint64 { return wakeups.Load() }

// testHookGaveUp, when set (tests only), runs after a waiter that gave up
// has left its queue and the object's mutex is free again.
var testHookGaveUp func()

// base is embedded in every object: its mutex, name and dead state.
type base struct {
	mu   sync.Mutex
	name string
	dead error // ErrDeleted or ErrShutdown once the object is gone
}

func (b *base) Name() string { return b.name }

// park waits for w, which the caller pushed on q with b.mu held; park
// releases b.mu. It returns true when w was granted, also when the grant
// raced with the timeout or ctx; false with a nil error on timeout, and the
// ctx's error or the object's failure otherwise.
func (b *base) park(ctx context.Context, q *waitQueue, w *waiter, timeout time.Duration) (bool, error) {
	return b.parkThen(ctx, q, w, timeout, nil)
}

// parkThen is park, and when w gives up (its timeout or ctx ended before
// an answer) it runs gaveUp, if not nil, under b.mu in the same hold that
// takes w off q: what giving up does to the object happens with the
// removal, never after a gap in which another caller finds the object as
// though w still waited (a Barrier still counting a party that has left).
func (b *base) parkThen(ctx context.Context, q *waitQueue, w *waiter, timeout time.Duration, gaveUp func()) (bool, error) {
	b.mu.Unlock()
	var tc <-chan time.Time
	if timeout >= 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	var err error
	select {
	case <-w.ready:
		return w.err == nil, w.err
	case <-tc:
	case <-ctx.Done():
		err = ctx.Err()
	}
	b.mu.Lock()
	removed := q.remove(w)
	if removed && gaveUp != nil {
		gaveUp()
	}
	b.mu.Unlock()
	if removed {
		if testHookGaveUp != nil {
			testHookGaveUp()
		}
		return false, err
	}
	<-w.ready // already closed: it was granted or failed under b.mu
	return w.err == nil, w.err
}
