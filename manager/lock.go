package manager

import (
	"context"
	"fmt"
	"time"
)

// Lock is a non-recursive mutual-exclusion lock, as threading.Lock: any
// session may release it. The holder is recorded so that the lock is freed
// when the holding session ends.
type Lock struct {
	base
	held    bool
	owner   *Session
	tid     int64
	waiters waitQueue
}

func newLock(name string) *Lock { return &Lock{base: base{name: name}} }

// Kind implements Object.
func (l *Lock) Kind() Kind { return KindLock }

// Acquire takes the lock for (s, tid). With block false it does not wait; a
// negative timeout waits for ever. It reports whether the lock was taken.
func (l *Lock) Acquire(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (bool, error) {
	l.mu.Lock()
	if l.dead != nil {
		l.mu.Unlock()
		return false, l.dead
	}
	if !l.held {
		l.take(s, tid)
		l.mu.Unlock()
		return true, nil
	}
	if !block {
		l.mu.Unlock()
		return false, nil
	}
	w := newWaiter(s, tid)
	l.waiters.push(w)
	return l.park(ctx, &l.waiters, w, timeout)
}

func (l *Lock) take(s *Session, tid int64) {
	l.held, l.owner, l.tid = true, s, tid
	s.hold(l)
}

// handOn gives the lock to the first waiter, or frees it.
func (l *Lock) handOn() {
	l.owner.unhold(l)
	if w := l.waiters.front(); w != nil {
		l.take(w.sess, w.tid)
		l.waiters.grant(w)
		return
	}
	l.held, l.owner, l.tid = false, nil, 0
}

// Release frees the lock; releasing an unlocked lock is ErrNotOwner.
func (l *Lock) Release(s *Session, tid int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		return fmt.Errorf("%w: release of an unlocked lock", ErrNotOwner)
	}
	l.handOn()
	return nil
}

// Locked reports whether the lock is held.
func (l *Lock) Locked() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

func (l *Lock) releaseSession(s *Session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held && l.owner == s {
		l.handOn()
	}
}

// Describe implements Object.
func (l *Lock) Describe() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		return "unlocked", l.waiters.len()
	}
	return fmt.Sprintf("locked by session %d thread %d", l.owner.ID, l.tid), l.waiters.len()
}

func (l *Lock) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead = err
	l.waiters.failAll(err)
}

// RLock is a reentrant lock owned by a (session, thread) pair, as
// threading.RLock.
type RLock struct {
	base
	owner   *Session
	tid     int64
	count   int64
	waiters waitQueue
}

func newRLock(name string) *RLock { return &RLock{base: base{name: name}} }

// Kind implements Object.
func (r *RLock) Kind() Kind { return KindRLock }

// Acquire takes the lock for (s, tid), nesting when that pair owns it.
func (r *RLock) Acquire(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (bool, error) {
	r.mu.Lock()
	if r.dead != nil {
		r.mu.Unlock()
		return false, r.dead
	}
	if r.count == 0 {
		r.take(s, tid, 1)
		r.mu.Unlock()
		return true, nil
	}
	if r.owner == s && r.tid == tid {
		r.count++
		r.mu.Unlock()
		return true, nil
	}
	if !block {
		r.mu.Unlock()
		return false, nil
	}
	w := newWaiter(s, tid)
	r.waiters.push(w)
	return r.park(ctx, &r.waiters, w, timeout)
}

func (r *RLock) take(s *Session, tid int64, n int64) {
	r.owner, r.tid, r.count = s, tid, n
	s.hold(r)
}

func (r *RLock) handOn() {
	r.owner.unhold(r)
	if w := r.waiters.front(); w != nil {
		r.take(w.sess, w.tid, 1)
		r.waiters.grant(w)
		return
	}
	r.owner, r.tid, r.count = nil, 0, 0
}

// Release undoes one Acquire by (s, tid); anyone else gets ErrNotOwner.
func (r *RLock) Release(s *Session, tid int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.count == 0 || r.owner != s || r.tid != tid {
		return fmt.Errorf("%w: cannot release un-acquired rlock", ErrNotOwner)
	}
	if r.count--; r.count == 0 {
		r.handOn()
	}
	return nil
}

func (r *RLock) releaseSession(s *Session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.count > 0 && r.owner == s {
		r.handOn()
	}
}

// Describe implements Object.
func (r *RLock) Describe() (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.count == 0 {
		return "unlocked", r.waiters.len()
	}
	return fmt.Sprintf("locked by session %d thread %d, depth %d", r.owner.ID, r.tid, r.count), r.waiters.len()
}

func (r *RLock) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dead = err
	r.waiters.failAll(err)
}
