package manager

import (
	"context"
	"fmt"
	"time"
)

// MaxSemaphore is the largest semaphore value (the state word counts units
// in 32 bits).
const MaxSemaphore = 1<<32 - 2

// Semaphore is a counting semaphore, as threading.Semaphore, or with bounded
// set as threading.BoundedSemaphore. Its free units are a SemState; units a
// session acquired and did not release go back when the session ends.
type Semaphore struct {
	base
	st      SemState
	initial int64
	bounded bool
	held    map[Slot]semHold // units held per slot
	waiters waitQueue
}

// semHold counts one slot's units; sess is for hold accounting only.
type semHold struct {
	n    int64
	sess *Session
}

func newSemaphore(name string, value int64, bounded bool) (*Semaphore, error) {
	if value < 0 || value > MaxSemaphore {
		return nil, fmt.Errorf("%w: semaphore initial value must be 0 to %d", ErrValue, int64(MaxSemaphore))
	}
	m := &Semaphore{base: base{name: name}, initial: value, bounded: bounded, held: make(map[Slot]semHold)}
	m.st.Add(value)
	// No waiters bit: a semaphore's word is never shared (its units are
	// owned per session, which one word cannot record), and bit 30 counts.
	return m, nil
}

// Kind implements Object.
func (m *Semaphore) Kind() Kind {
	if m.bounded {
		return KindBoundedSemaphore
	}
	return KindSemaphore
}

// State returns the semaphore's state word.
func (m *Semaphore) State() *SemState { return &m.st }

// AcquireGrant takes one unit for s. Undoing the grant gives the unit back.
func (m *Semaphore) AcquireGrant(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (Grant, error) {
	m.mu.Lock()
	if m.dead != nil {
		m.mu.Unlock()
		return Grant{}, m.dead
	}
	if m.st.Free() > 0 && m.waiters.len() == 0 {
		m.st.Add(-1)
		m.credit(s)
		m.mu.Unlock()
		return Grant{obj: m, sess: s, ok: true}, nil
	}
	if !block || timeout == 0 {
		m.mu.Unlock()
		return Grant{}, nil
	}
	w := newWaiter(s, tid)
	m.waiters.push(w)
	ok, err := m.park(ctx, &m.waiters, w, timeout)
	if !ok {
		return Grant{}, err
	}
	return Grant{obj: m, sess: s, ok: true}, nil
}

// Acquire is AcquireGrant committed at once.
func (m *Semaphore) Acquire(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (bool, error) {
	g, err := m.AcquireGrant(ctx, s, tid, block, timeout)
	g.Commit()
	return g.OK(), err
}

func (m *Semaphore) credit(s *Session) {
	h := m.held[s.Slot()]
	h.n++
	h.sess = s
	m.held[s.Slot()] = h
	s.hold(m)
}

// debit takes one unit off slot's count. A session may release a unit it
// did not acquire (as with threading); that unit then comes off another
// holder's count, or the holder's session end would give it back a second
// time (and push a BoundedSemaphore over its bound).
func (m *Semaphore) debit(slot Slot) {
	h, ok := m.held[slot]
	if !ok {
		for sl, oh := range m.held {
			slot, h, ok = sl, oh, true
			break
		}
		if !ok {
			return
		}
	}
	if h.n--; h.n == 0 {
		delete(m.held, slot)
	} else {
		m.held[slot] = h
	}
	h.sess.unhold(m)
}

// giveUnit hands one unit to the first waiter or adds it to the free units.
func (m *Semaphore) giveUnit() {
	if w := m.waiters.front(); w != nil {
		m.credit(w.sess)
		m.waiters.grant(w)
		return
	}
	m.st.Add(1)
}

// Release returns one unit. Any session may release (as threading); a
// BoundedSemaphore released above its initial value is ErrValue.
func (m *Semaphore) Release(s *Session, tid int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bounded && m.waiters.len() == 0 && m.st.Free() >= m.initial {
		return fmt.Errorf("%w: semaphore released too many times", ErrValue)
	}
	if m.st.Free() >= MaxSemaphore {
		return fmt.Errorf("%w: semaphore value would exceed %d", ErrValue, int64(MaxSemaphore))
	}
	m.debit(s.Slot())
	m.giveUnit()
	return nil
}

func (m *Semaphore) undo(g *Grant) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held[g.sess.Slot()].n > 0 {
		m.debit(g.sess.Slot())
		m.giveUnit()
	}
}

// Value returns the number of free units.
func (m *Semaphore) Value() int64 { return m.st.Free() }

func (m *Semaphore) releaseSession(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for n := m.held[s.Slot()].n; n > 0; n-- {
		m.debit(s.Slot())
		m.giveUnit()
	}
}

func (m *Semaphore) heldBy(n map[Slot]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for sl, h := range m.held {
		n[sl] += int(h.n)
	}
}

// Describe implements Object.
func (m *Semaphore) Describe() (string, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fmt.Sprintf("value %d of %d", m.st.Free(), m.initial), m.waiters.len()
}

func (m *Semaphore) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dead = err
	m.waiters.failAll(err)
}
