package manager

import (
	"context"
	"fmt"
	"time"
)

// Lock is a non-recursive mutual-exclusion lock, as threading.Lock: any
// session may release it. Its state is a LockState (owner slot and thread);
// the lock is freed when the owning session ends.
type Lock struct {
	base
	st      LockState
	holder  *Session // accounting only: whose hold list names this lock
	waiters waitQueue
}

func newLock(name string) *Lock {
	l := &Lock{base: base{name: name}}
	l.waiters.word = &l.st.W0
	return l
}

// Kind implements Object.
func (l *Lock) Kind() Kind { return KindLock }

// State returns the lock's state words.
func (l *Lock) State() *LockState { return &l.st }

// AcquireGrant takes the lock for (s, tid). With block false it does not
// wait; a negative timeout waits for ever. The grant is OK when the lock was
// taken; undoing it releases the lock.
func (l *Lock) AcquireGrant(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (Grant, error) {
	l.mu.Lock()
	if l.dead != nil {
		l.mu.Unlock()
		return Grant{}, l.dead
	}
	if l.take(s, tid) {
		l.mu.Unlock()
		return Grant{obj: l, sess: s, tid: tid, ok: true}, nil
	}
	if !block || timeout == 0 {
		l.mu.Unlock()
		return Grant{}, nil
	}
	w := newWaiter(s, tid)
	l.waiters.push(w)
	// The push set the daemon-waiters bit; a fast-path holder may have freed
	// the word by CAS between the failed take and that bit. Look again.
	if l.waiters.len() == 1 && l.take(s, tid) {
		l.waiters.remove(w)
		l.mu.Unlock()
		return Grant{obj: l, sess: s, tid: tid, ok: true}, nil
	}
	ok, err := l.park(ctx, &l.waiters, w, timeout)
	if !ok {
		return Grant{}, err
	}
	return Grant{obj: l, sess: s, tid: tid, ok: true}, nil
}

// Acquire is AcquireGrant committed at once, for callers that deliver the
// result themselves.
func (l *Lock) Acquire(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (bool, error) {
	g, err := l.AcquireGrant(ctx, s, tid, block, timeout)
	g.Commit()
	return g.OK(), err
}

// endHold ends the hold of h the daemon recorded for holder: reported when
// holder is still the word's owner, dropped when it is not (it released by
// CAS meanwhile, at a time the daemon does not know).
func endHold(holder *Session, owner Slot, h holder) {
	if holder != nil && holder.Slot() == owner {
		holder.unhold(h)
	} else {
		holder.dropHold(h)
	}
}

func (l *Lock) take(s *Session, tid int64) bool {
	if !l.st.TryTake(s.Slot(), tid) {
		return false
	}
	l.holder.dropHold(l) // the word was free: a recorded holder released by CAS
	l.holder = s
	s.hold(l)
	return true
}

// handOn gives the lock to the first waiter, or frees it.
func (l *Lock) handOn() {
	endHold(l.holder, l.st.Owner(), l)
	l.holder = nil
	if w := l.waiters.front(); w != nil {
		// Straight to the waiter: the word never reads free in between.
		l.st.Transfer(w.sess.Slot(), w.tid)
		l.holder = w.sess
		w.sess.hold(l)
		l.waiters.grant(w)
		return
	}
	l.st.Free()
}

// Release frees the lock; releasing an unlocked lock is ErrNotOwner.
func (l *Lock) Release(s *Session, tid int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st.Owner() == 0 {
		return fmt.Errorf("%w: release of an unlocked lock", ErrNotOwner)
	}
	l.handOn()
	return nil
}

func (l *Lock) undo(g *Grant) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st.Owner() == g.sess.Slot() {
		l.handOn()
	}
}

// Locked reports whether the lock is held.
func (l *Lock) Locked() bool { return l.st.Owner() != 0 }

func (l *Lock) releaseSession(s *Session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st.Owner() == s.Slot() {
		if l.holder != s { // taken by CAS: the daemon never saw the acquire
			t, _ := heldSince(nil, s.Slot(), l, &l.st.Since)
			s.fastHoldEnded(l, t)
		}
		l.handOn()
	}
}

// Describe implements Object.
func (l *Lock) Describe() (string, int) { return l.describeBy(nil) }

func (l *Lock) describeBy(bySlot func(Slot) *Session) (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st.Owner() == 0 {
		return "unlocked", l.waiters.len()
	}
	return fmt.Sprintf("locked by %s thread %d", describeOwner(l.holder, l.st.Owner(), bySlot), int64(l.st.TID.Load())), l.waiters.len()
}

func (l *Lock) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead = err
	l.waiters.failAll(err)
}

// RLock is a reentrant lock owned by a (session slot, thread) pair, as
// threading.RLock. Its state is an RLockState.
type RLock struct {
	base
	st      RLockState
	holder  *Session // accounting only
	waiters waitQueue
}

func newRLock(name string) *RLock {
	r := &RLock{base: base{name: name}}
	r.waiters.word = &r.st.W0
	return r
}

// Kind implements Object.
func (r *RLock) Kind() Kind { return KindRLock }

// State returns the lock's state words.
func (r *RLock) State() *RLockState { return &r.st }

// AcquireGrant takes the lock for (s, tid), nesting when that pair owns
// it. Undoing the grant releases the one level it took.
func (r *RLock) AcquireGrant(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (Grant, error) {
	r.mu.Lock()
	if r.dead != nil {
		r.mu.Unlock()
		return Grant{}, r.dead
	}
	slot, otid, depth := r.st.Owner()
	switch {
	case depth == 0 && r.tryTake(s, tid):
	case depth > 0 && slot == s.Slot() && otid == tid:
		r.st.Set(slot, tid, depth+1)
	case !block || timeout == 0:
		r.mu.Unlock()
		return Grant{}, nil
	default:
		w := newWaiter(s, tid)
		r.waiters.push(w)
		// As for Lock: a fast-path owner may have freed the word before the
		// push set the daemon-waiters bit.
		if r.waiters.len() == 1 && r.tryTake(s, tid) {
			r.waiters.remove(w)
			r.mu.Unlock()
			return Grant{obj: r, sess: s, tid: tid, ok: true}, nil
		}
		ok, err := r.park(ctx, &r.waiters, w, timeout)
		if !ok {
			return Grant{}, err
		}
		return Grant{obj: r, sess: s, tid: tid, ok: true}, nil
	}
	r.mu.Unlock()
	return Grant{obj: r, sess: s, tid: tid, ok: true}, nil
}

// Acquire is AcquireGrant committed at once.
func (r *RLock) Acquire(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (bool, error) {
	g, err := r.AcquireGrant(ctx, s, tid, block, timeout)
	g.Commit()
	return g.OK(), err
}

// tryTake makes (s, tid) the owner if the word is free, by compare-and-swap:
// a fast-path client may take it at the same moment.
func (r *RLock) tryTake(s *Session, tid int64) bool {
	if !r.st.TryTake(s.Slot(), tid) {
		return false
	}
	r.holder.dropHold(r) // the word was free: a recorded holder released by CAS
	r.holder = s
	s.hold(r)
	return true
}

func (r *RLock) take(s *Session, tid int64, n int64) {
	r.st.Set(s.Slot(), tid, n)
	r.holder = s
	s.hold(r)
}

func (r *RLock) handOn() {
	slot, _, _ := r.st.Owner()
	endHold(r.holder, slot, r)
	r.holder = nil
	if w := r.waiters.front(); w != nil {
		r.take(w.sess, w.tid, 1) // straight to the waiter
		r.waiters.grant(w)
		return
	}
	r.st.Set(0, 0, 0)
}

// Release undoes one Acquire by (s, tid); anyone else gets ErrNotOwner.
func (r *RLock) Release(s *Session, tid int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.releaseOne(s.Slot(), tid) {
		return fmt.Errorf("%w: cannot release un-acquired rlock", ErrNotOwner)
	}
	return nil
}

// releaseOne drops one level held by (slot, tid); false if it holds none.
func (r *RLock) releaseOne(slot Slot, tid int64) bool {
	oslot, otid, depth := r.st.Owner()
	if depth == 0 || oslot != slot || otid != tid {
		return false
	}
	if depth == 1 {
		r.handOn()
	} else {
		r.st.Set(oslot, otid, depth-1)
	}
	return true
}

func (r *RLock) undo(g *Grant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releaseOne(g.sess.Slot(), g.tid)
}

func (r *RLock) releaseSession(s *Session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if slot, _, depth := r.st.Owner(); depth > 0 && slot == s.Slot() {
		if r.holder != s { // taken by CAS: the daemon never saw the acquire
			t, _ := heldSince(nil, s.Slot(), r, &r.st.Since)
			s.fastHoldEnded(r, t)
		}
		r.handOn()
	}
}

// Describe implements Object.
func (r *RLock) Describe() (string, int) { return r.describeBy(nil) }

func (r *RLock) describeBy(bySlot func(Slot) *Session) (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	slot, tid, depth := r.st.Owner()
	if depth == 0 {
		return "unlocked", r.waiters.len()
	}
	return fmt.Sprintf("locked by %s thread %d, depth %d", describeOwner(r.holder, slot, bySlot), tid, depth), r.waiters.len()
}

func (r *RLock) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dead = err
	r.waiters.failAll(err)
}

// describeOwner names a holder for status listings: by session id when the
// daemon recorded the holder or bySlot (nil: none) knows the session of the
// slot a fast-path owner wrote, by slot otherwise.
func describeOwner(holder *Session, slot Slot, bySlot func(Slot) *Session) string {
	if holder == nil || holder.Slot() != slot {
		holder = nil
		if bySlot != nil {
			holder = bySlot(slot)
		}
	}
	if holder != nil {
		return fmt.Sprintf("session %d", holder.ID)
	}
	return fmt.Sprintf("slot %d", slot)
}

// heldBy counts what each slot holds of the object, for status: a lock's
// word names its owner whether the daemon or a compare-and-swap took it.
func (l *Lock) heldBy(n map[Slot]int) {
	if o := l.st.Owner(); o != 0 {
		n[o]++
	}
}

func (r *RLock) heldBy(n map[Slot]int) {
	if o, _, d := r.st.Owner(); d > 0 {
		n[o]++
	}
}

// ownerDescriber is an object whose description names an owner's slot;
// Snapshot passes the live sessions by slot so that it names the session.
type ownerDescriber interface {
	describeBy(bySlot func(Slot) *Session) (string, int)
}

// HeldSince reports when the lock's current holder took it.
func (l *Lock) HeldSince() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return heldSince(l.holder, l.st.Owner(), l, &l.st.Since)
}

// HeldSince reports when the lock's current holder took it (its outermost
// acquire).
func (r *RLock) HeldSince() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	slot, _, _ := r.st.Owner()
	return heldSince(r.holder, slot, r, &r.st.Since)
}
