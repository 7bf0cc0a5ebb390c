package manager

import (
	"context"
	"fmt"
	"time"
)

// condLock is a lock a Condition can wait on: a Lock or an RLock.
type condLock interface {
	Object
	AcquireGrant(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (Grant, error)
	Acquire(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (bool, error)
	Release(s *Session, tid int64) error
	// ownedBy reports whether (s, tid) holds the lock.
	ownedBy(s *Session, tid int64) bool
	// releaseForWait releases the lock fully and returns what reacquire
	// needs to restore it.
	releaseForWait(s *Session, tid int64) (saved int64, err error)
	// reacquire takes the lock again after a wait.
	reacquire(ctx context.Context, s *Session, tid int64, saved int64) error
}

func (l *Lock) ownedBy(s *Session, _ int64) bool { return l.st.Owner() == s.Slot() }

func (l *Lock) releaseForWait(s *Session, _ int64) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st.Owner() != s.Slot() {
		return 0, fmt.Errorf("%w: cannot wait on un-acquired lock", ErrNotOwner)
	}
	l.handOn()
	return 1, nil
}

func (l *Lock) reacquire(ctx context.Context, s *Session, tid int64, _ int64) error {
	ok, err := l.Acquire(ctx, s, tid, true, Forever)
	if err == nil && !ok {
		err = context.Canceled
	}
	return err
}

func (r *RLock) ownedBy(s *Session, tid int64) bool {
	slot, otid, depth := r.st.Owner()
	return depth > 0 && slot == s.Slot() && otid == tid
}

func (r *RLock) releaseForWait(s *Session, tid int64) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	slot, otid, depth := r.st.Owner()
	if depth == 0 || slot != s.Slot() || otid != tid {
		return 0, fmt.Errorf("%w: cannot wait on un-acquired lock", ErrNotOwner)
	}
	r.handOn()
	return depth, nil
}

func (r *RLock) reacquire(ctx context.Context, s *Session, tid int64, saved int64) error {
	ok, err := r.Acquire(ctx, s, tid, true, Forever)
	if err == nil && !ok {
		err = context.Canceled
	}
	if err != nil {
		return err
	}
	r.mu.Lock()
	if slot, otid, depth := r.st.Owner(); depth > 0 && slot == s.Slot() && otid == tid {
		r.st.Set(slot, otid, saved)
	}
	r.mu.Unlock()
	return nil
}

// Condition is a condition variable over a Lock or RLock, as
// threading.Condition. A waiter that is cancelled after being notified
// passes the notification on, so a dying waiter never eats a notify meant
// for a live one.
type Condition struct {
	base
	lock    condLock
	waiters waitQueue
}

func newCondition(name string, lock condLock) *Condition {
	return &Condition{base: base{name: name}, lock: lock}
}

// Kind implements Object.
func (c *Condition) Kind() Kind { return KindCondition }

// LockName returns the name of the underlying lock.
func (c *Condition) LockName() string { return c.lock.Name() }

// AcquireGrant acquires the underlying lock; see Lock.AcquireGrant.
func (c *Condition) AcquireGrant(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (Grant, error) {
	return c.lock.AcquireGrant(ctx, s, tid, block, timeout)
}

// Acquire acquires the underlying lock.
func (c *Condition) Acquire(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (bool, error) {
	return c.lock.Acquire(ctx, s, tid, block, timeout)
}

// Release releases the underlying lock.
func (c *Condition) Release(s *Session, tid int64) error { return c.lock.Release(s, tid) }

// Wait is WaitGrant committed at once.
func (c *Condition) Wait(ctx context.Context, s *Session, tid int64, timeout time.Duration) (bool, error) {
	g, err := c.WaitGrant(ctx, s, tid, timeout)
	g.Commit()
	return g.OK(), err
}

// WaitGrant releases the lock, waits for a notify or the timeout, and
// reacquires the lock. The grant is OK when the wait was notified; on
// success (notified or timed out) the caller holds the lock again. The
// caller must hold the lock. On an error (ctx cancelled, object deleted,
// shutdown) the lock is not reacquired: an error always means the caller
// does not hold it. Undoing the grant brings about that same state: the
// notification goes to the next waiter and the lock is released.
func (c *Condition) WaitGrant(ctx context.Context, s *Session, tid int64, timeout time.Duration) (Grant, error) {
	notified, err := c.wait(ctx, s, tid, timeout)
	if err != nil {
		return Grant{}, err
	}
	return Grant{obj: c, sess: s, tid: tid, ok: notified}, nil
}

func (c *Condition) undo(g *Grant) {
	if g.ok {
		c.notify(1)
	}
	_, _ = c.lock.releaseForWait(g.sess, g.tid)
}

func (c *Condition) wait(ctx context.Context, s *Session, tid int64, timeout time.Duration) (bool, error) {
	c.mu.Lock()
	if c.dead != nil {
		c.mu.Unlock()
		return false, c.dead
	}
	w := newWaiter(s, tid)
	c.waiters.push(w) // queued before the lock is released: no notify is missed
	c.mu.Unlock()
	saved, err := c.lock.releaseForWait(s, tid)
	if err != nil {
		c.mu.Lock()
		c.waiters.remove(w)
		c.mu.Unlock()
		return false, err
	}
	c.mu.Lock()
	notified, werr := c.park(ctx, &c.waiters, w, timeout)
	if notified && ctx.Err() != nil {
		c.notify(1) // we cannot use it: hand it to the next waiter
		notified = false
	}
	if werr != nil {
		// Cancelled, deleted or shutting down: the lock is not taken back,
		// so an error answer always means the caller does not hold it.
		return false, werr
	}
	if rerr := c.lock.reacquire(ctx, s, tid, saved); rerr != nil {
		return false, rerr
	}
	return notified, nil
}

// Notify wakes up to n waiters; the caller must hold the lock.
func (c *Condition) Notify(s *Session, tid int64, n int) error {
	if !c.lock.ownedBy(s, tid) {
		return fmt.Errorf("%w: cannot notify on un-acquired lock", ErrNotOwner)
	}
	c.notify(n)
	return nil
}

// NotifyAll wakes every waiter; the caller must hold the lock.
func (c *Condition) NotifyAll(s *Session, tid int64) error {
	return c.Notify(s, tid, -1)
}

func (c *Condition) notify(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w := c.waiters.front(); w != nil && n != 0; w = c.waiters.front() {
		c.waiters.grant(w)
		n--
	}
}

// Describe implements Object.
func (c *Condition) Describe() (string, int) { return c.describeBy(nil) }

// heldBy counts the condition's private lock (a shared Lock is an object of
// its own, counted there).
func (c *Condition) heldBy(n map[Slot]int) {
	if r, ok := c.lock.(*RLock); ok && r.name == c.name+".lock" {
		r.heldBy(n)
	}
}

func (c *Condition) describeBy(bySlot func(Slot) *Session) (string, int) {
	var st string
	if d, ok := c.lock.(ownerDescriber); ok {
		st, _ = d.describeBy(bySlot)
	} else {
		st, _ = c.lock.Describe()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("lock %s: %s", c.lock.Name(), st), c.waiters.len()
}

func (c *Condition) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dead = err
	c.waiters.failAll(err)
}

// HeldSince reports when the holder of the condition's lock took it.
func (c *Condition) HeldSince() (time.Time, bool) {
	if h, ok := c.lock.(interface{ HeldSince() (time.Time, bool) }); ok {
		return h.HeldSince()
	}
	return time.Time{}, false
}
