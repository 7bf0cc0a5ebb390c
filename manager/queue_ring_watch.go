package manager

import (
	"context"
	"time"
)

// Waiting on a Queue's ring (the ring store's mark and wait, with which the
// Queue's put, get and join wait): the daemon's own changes wake its
// waiters at once; a watcher goroutine per ring sleeps on the ring's seq
// for changes clients make.

// lonePoll bounds a daemon waiter's sleep on a ring no live session was
// passed (see wait). A variable for tests.
var lonePoll = 50 * time.Millisecond

type timeoutError struct{}

func (timeoutError) Error() string { return "timeout" }

var errTimeout error = timeoutError{}

// mark is the ring's seq, which wait compares (under q.mu, before a try).
func (qr *ringStore) mark() uint32 { return qr.r.Seq() }

// wait returns when the ring's seq moves from seen (or may have: spurious
// returns are fine, callers retry), when ready closes (nil: never), at the
// deadline (errTimeout; zero: none) or when ctx ends.
//
// The daemon's own changes wake its waiters at once (wakeLocal). Changes
// fast-path clients make are seen by one watcher goroutine per ring, which
// sleeps on the futex for all the daemon's waiters while any session the
// ring was passed to lives (RingPassed): a ring only socket clients use
// costs no thread asleep in a system call. Without a watcher a waiter
// still looks again every lonePoll, a bound on a change made by a process
// that kept the ring past its session's end.
func (qr *ringStore) wait(ctx context.Context, seen uint32, deadline time.Time, ready <-chan struct{}) error {
	qr.wmu.Lock()
	ch := qr.wch
	qr.wn++
	watched := len(qr.users) > 0 || qr.refill
	if watched {
		qr.startWatch(seen)
	}
	qr.wmu.Unlock()
	defer func() {
		qr.wmu.Lock()
		qr.wn--
		qr.wmu.Unlock()
	}()
	if qr.r.Seq() != seen {
		return nil
	}
	var tc <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return errTimeout
		}
		t := time.NewTimer(d)
		defer t.Stop()
		tc = t.C
	}
	var poll <-chan time.Time
	if !watched {
		t := time.NewTimer(lonePoll)
		defer t.Stop()
		poll = t.C
	}
	select {
	case <-ch:
		return nil
	case <-ready: // nil: never
		return nil
	case <-poll:
		return nil
	case <-tc:
		return errTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wakeLocal wakes the daemon's own waiters on the ring (socket clients'
// gets, puts and joins) after a change the daemon made itself, at once
// rather than through the watcher, whose futex the change then need not
// wake (UnlockQuiet): the watcher sees it at its next look (a spurious
// retry at most). Called under q.mu (q.mu, then wmu).
func (qr *ringStore) wakeLocal() {
	qr.wmu.Lock()
	if qr.wn > 0 {
		close(qr.wch)
		qr.wch = make(chan struct{})
	}
	qr.wmu.Unlock()
}

// unlock lets go of the latch after a daemon op and, when the op changed
// the ring, wakes the daemon's waiters at once (wakeLocal) and clients
// through the futex.
func (qr *ringStore) unlock(changed bool) {
	qr.r.Unlock(changed)
	if changed {
		qr.wakeLocal()
	}
}

// unlockQuiet is unlock for an op that tells the daemon's own waiters
// itself (wakeLocal): the ring's futex is woken only for client sleepers
// (statemem.Ring.UnlockQuiet).
func (qr *ringStore) unlockQuiet(changed bool) {
	qr.r.UnlockQuiet(changed)
	if changed {
		qr.wakeLocal()
	}
}

// startWatch starts the watcher from seq last unless it runs (under wmu).
func (qr *ringStore) startWatch(last uint32) {
	if !qr.running {
		qr.running = true
		go qr.watch(last)
	}
}

// watch sleeps on the ring's seq while the daemon has waiters or over holds
// items; it wakes the waiters at every change (and every 20 ms, a bound on
// anything missed) and refills the ring from over (refillFromOver). It
// takes no lock while it sleeps, and q.mu (then the latch) only to refill.
func (qr *ringStore) watch(last uint32) {
	for {
		cur := qr.r.Seq()
		if cur == last {
			qr.r.Sleep(cur, 20*time.Millisecond)
			cur = qr.r.Seq()
		}
		last = cur
		qr.wmu.Lock()
		close(qr.wch)
		qr.wch = make(chan struct{})
		refill := qr.refill
		qr.wmu.Unlock()
		if refill {
			qr.refillFromOver()
		}
		qr.wmu.Lock()
		if (qr.wn == 0 || len(qr.users) == 0) && !qr.refill {
			qr.running = false
			qr.wmu.Unlock()
			return
		}
		qr.wmu.Unlock()
	}
}
