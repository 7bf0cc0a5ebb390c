package manager

import (
	"context"
	"fmt"
	"time"
)

// Semaphore is a counting semaphore, as threading.Semaphore, or with bounded
// set as threading.BoundedSemaphore. Units a session acquired and did not
// release go back when the session ends.
type Semaphore struct {
	base
	value   int64
	initial int64
	bounded bool
	held    map[*Session]int64
	waiters waitQueue
}

func newSemaphore(name string, value int64, bounded bool) (*Semaphore, error) {
	if value < 0 {
		return nil, fmt.Errorf("%w: semaphore initial value must be >= 0", ErrValue)
	}
	return &Semaphore{base: base{name: name}, value: value, initial: value, bounded: bounded, held: make(map[*Session]int64)}, nil
}

// Kind implements Object.
func (m *Semaphore) Kind() Kind {
	if m.bounded {
		return KindBoundedSemaphore
	}
	return KindSemaphore
}

// Acquire takes one unit for s.
func (m *Semaphore) Acquire(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (bool, error) {
	m.mu.Lock()
	if m.dead != nil {
		m.mu.Unlock()
		return false, m.dead
	}
	if m.value > 0 && m.waiters.len() == 0 {
		m.value--
		m.credit(s)
		m.mu.Unlock()
		return true, nil
	}
	if !block {
		m.mu.Unlock()
		return false, nil
	}
	w := newWaiter(s, tid)
	m.waiters.push(w)
	return m.park(ctx, &m.waiters, w, timeout)
}

func (m *Semaphore) credit(s *Session) {
	m.held[s]++
	s.hold(m)
}

// debit takes one unit off s's count. A session may release a unit it did
// not acquire (as with threading); that unit then comes off another
// holder's count, or the holder's session end would give it back a second
// time (and push a BoundedSemaphore over its bound).
func (m *Semaphore) debit(s *Session) {
	if m.held[s] == 0 {
		for h := range m.held {
			s = h
			break
		}
		if m.held[s] == 0 {
			return
		}
	}
	if m.held[s]--; m.held[s] == 0 {
		delete(m.held, s)
	}
	s.unhold(m)
}

// giveUnit hands one unit to the first waiter or adds it to the value.
func (m *Semaphore) giveUnit() {
	if w := m.waiters.front(); w != nil {
		m.credit(w.sess)
		m.waiters.grant(w)
		return
	}
	m.value++
}

// Release returns one unit. Any session may release (as threading); a
// BoundedSemaphore released above its initial value is ErrValue.
func (m *Semaphore) Release(s *Session, tid int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bounded && m.waiters.len() == 0 && m.value >= m.initial {
		return fmt.Errorf("%w: semaphore released too many times", ErrValue)
	}
	m.debit(s)
	m.giveUnit()
	return nil
}

// Value returns the number of free units.
func (m *Semaphore) Value() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.value
}

func (m *Semaphore) releaseSession(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for n := m.held[s]; n > 0; n-- {
		m.debit(s)
		m.giveUnit()
	}
}

// Describe implements Object.
func (m *Semaphore) Describe() (string, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fmt.Sprintf("value %d of %d", m.value, m.initial), m.waiters.len()
}

func (m *Semaphore) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dead = err
	m.waiters.failAll(err)
}
