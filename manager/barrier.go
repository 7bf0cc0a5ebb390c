package manager

import (
	"context"
	"fmt"
	"time"
)

const (
	barrierFilling  = iota
	barrierDraining // the last party runs the action
	barrierBroken
)

// Barrier is a cyclic barrier for a fixed number of parties, as
// threading.Barrier. The action, if any, runs in the client of the last
// party to arrive: its Wait reports runAction, the others stay parked until
// it calls ActionDone. A party that times out, is cancelled or dies while
// waiting (or while running the action) breaks the barrier for all.
type Barrier struct {
	base
	parties   int64
	hasAction bool
	timeout   time.Duration // default wait timeout; Forever for none
	state     int
	count     int64
	actor     *Session // runs the action while draining (compared by slot)
	waiters   waitQueue
}

func newBarrier(name string, parties int64, hasAction bool, timeout time.Duration) (*Barrier, error) {
	if parties < 1 {
		return nil, fmt.Errorf("%w: a barrier needs at least one party", ErrValue)
	}
	return &Barrier{base: base{name: name}, parties: parties, hasAction: hasAction, timeout: timeout}, nil
}

// Kind implements Object.
func (b *Barrier) Kind() Kind { return KindBarrier }

// Parties returns the number of parties.
func (b *Barrier) Parties() int64 { return b.parties }

// Wait is WaitGrant committed at once.
func (b *Barrier) Wait(ctx context.Context, s *Session, timeout time.Duration) (index int64, runAction bool, err error) {
	g, err := b.WaitGrant(ctx, s, timeout)
	g.Commit()
	return g.Index(), g.RunAction(), err
}

// WaitGrant arrives at the barrier and waits for the others. The grant
// holds the party's index (0 .. parties-1); when its RunAction is true the
// caller is the last party and must run the action, then call ActionDone.
// Undoing that grant breaks the barrier (nobody will run the action);
// undoing any other grant does nothing, the others have passed. A negative
// timeout uses the barrier's default.
func (b *Barrier) WaitGrant(ctx context.Context, s *Session, timeout time.Duration) (Grant, error) {
	index, runAction, err := b.wait(ctx, s, timeout)
	if err != nil {
		return Grant{}, err
	}
	g := Grant{sess: s, index: index, ok: true, action: runAction}
	if runAction {
		g.obj = b
	}
	return g, nil
}

func (b *Barrier) undo(g *Grant) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == barrierDraining && b.actor.Slot() == g.sess.Slot() {
		b.breakLocked()
	}
}

func (b *Barrier) wait(ctx context.Context, s *Session, timeout time.Duration) (index int64, runAction bool, err error) {
	if timeout < 0 {
		timeout = b.timeout
	}
	b.mu.Lock()
	if b.dead != nil {
		b.mu.Unlock()
		return 0, false, b.dead
	}
	if b.state != barrierFilling {
		b.mu.Unlock()
		return 0, false, ErrBroken
	}
	index = b.count
	b.count++
	if b.count == b.parties {
		if b.hasAction {
			b.state = barrierDraining
			b.actor = s
			s.hold(b)
			b.mu.Unlock()
			return index, true, nil
		}
		b.releaseAll()
		b.mu.Unlock()
		return index, false, nil
	}
	w := newWaiter(s, 0)
	w.n = index
	b.waiters.push(w)
	// A party that times out or is cancelled breaks the barrier as it
	// leaves: with the count still holding it, a party arriving after it
	// left would otherwise complete the round alone.
	ok, err := b.parkThen(ctx, &b.waiters, w, timeout, b.breakLocked)
	if ok {
		return w.n, false, nil
	}
	if err == nil {
		err = ErrBroken
	}
	return 0, false, err
}

// releaseAll lets every waiter through and starts a new cycle.
func (b *Barrier) releaseAll() {
	for w := b.waiters.front(); w != nil; w = b.waiters.front() {
		b.waiters.grant(w)
	}
	b.count = 0
	b.state = barrierFilling
}

func (b *Barrier) breakLocked() {
	b.state = barrierBroken
	b.count = 0
	if b.actor != nil {
		b.actor.unhold(b)
		b.actor = nil
	}
	b.waiters.failAll(ErrBroken)
}

// ActionDone ends the action run by the last party: ok releases everyone,
// !ok (the action raised) breaks the barrier.
func (b *Barrier) ActionDone(s *Session, ok bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != barrierDraining || b.actor.Slot() != s.Slot() {
		return fmt.Errorf("%w: no barrier action is pending for this client", ErrValue)
	}
	if !ok {
		b.breakLocked()
		return nil
	}
	b.actor.unhold(b)
	b.actor = nil
	b.releaseAll()
	return nil
}

// Abort puts the barrier into the broken state.
func (b *Barrier) Abort() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.breakLocked()
}

// Reset returns the barrier to its initial state; parties waiting get
// ErrBroken.
func (b *Barrier) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.breakLocked()
	b.state = barrierFilling
}

// Broken reports whether the barrier is broken.
func (b *Barrier) Broken() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == barrierBroken
}

// NWaiting returns the number of parties waiting.
func (b *Barrier) NWaiting() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int64(b.waiters.len())
}

func (b *Barrier) releaseSession(s *Session) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == barrierDraining && b.actor.Slot() == s.Slot() {
		b.breakLocked()
	}
}

// Describe implements Object.
func (b *Barrier) Describe() (string, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := [...]string{"filling", "running action", "broken"}[b.state]
	return fmt.Sprintf("%s, %d of %d arrived", st, b.count, b.parties), b.waiters.len()
}

func (b *Barrier) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dead = err
	b.waiters.failAll(err)
}
