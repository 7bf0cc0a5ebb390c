package manager

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// MaxSemaphore is the largest semaphore value (a state word counts free
// units in 29 bits, beside its flags and latch).
const MaxSemaphore = int64(slotMask)

// Semaphore is a counting semaphore, as threading.Semaphore, or with bounded
// set as threading.BoundedSemaphore. Units a session acquired and did not
// release go back when the session ends.
//
// Its state is a SemState: free units and a latch in the word, and in
// shared memory a ledger of the units each session took by compare-and-swap
// (see statemem.SemAcquire). The daemon keeps the units it granted itself
// in held, and total, the sum of free, held and ledger units whenever the
// latch is free; every daemon op takes the latch as clients do.
type Semaphore struct {
	base
	st      SemState
	initial int64
	total   int64 // free + held + ledger units: grows only by a release nobody's units pay for
	bounded bool
	held    map[Slot]semHold // units the daemon granted, per slot
	waiters waitQueue
	gone    func(Slot) bool // whether the session of a slot has ended (fast path)
}

// semHold counts one slot's units; sess is for hold accounting only.
type semHold struct {
	n    int64
	sess *Session
}

func newSemaphore(name string, value int64, bounded bool) (*Semaphore, error) {
	if value < 0 || value > MaxSemaphore {
		return nil, fmt.Errorf("%w: semaphore initial value must be 0 to %d", ErrValue, MaxSemaphore)
	}
	m := &Semaphore{base: base{name: name}, initial: value, total: value, bounded: bounded, held: make(map[Slot]semHold)}
	m.st.W0.Store(uint64(value))
	m.waiters.word = &m.st.W0
	return m, nil
}

// Kind implements Object.
func (m *Semaphore) Kind() Kind {
	if m.bounded {
		return KindBoundedSemaphore
	}
	return KindSemaphore
}

// State returns the semaphore's state.
func (m *Semaphore) State() *SemState { return &m.st }

// claim takes the latch (called with m.mu held), waiting out a live
// session's op and taking over that of a session that ended mid-op, whose
// ledger entry it then recounts. It returns the free units; every claim
// ends with commit. While it waits it lets go of m.mu: ending the dead
// session, or deleting the object, must not wait for it (the session's end
// takes the manager's lock, which a Delete holds while it takes m.mu).
func (m *Semaphore) claim() int64 {
	for spins := 0; ; spins++ {
		x, ok := m.st.Claim(m.gone)
		if ok {
			if p := Slot(x >> latchShift & slotMask); p != 0 {
				m.recount(p)
			}
			return m.st.Free()
		}
		if spins < 100 {
			runtime.Gosched()
			continue
		}
		m.mu.Unlock()
		time.Sleep(50 * time.Microsecond)
		m.mu.Lock()
	}
}

// commit adds delta to the free units and lets the latch go.
func (m *Semaphore) commit(delta int64) { m.st.Commit(delta) }

// recount sets the ledger entry of slot, whose session ended holding the
// latch, to what the total leaves for it: whichever step of its op it died
// at, the other entries, the daemon's grants and the free units are exact.
func (m *Semaphore) recount(slot Slot) {
	n := m.total - m.st.Free()
	for sl := range m.st.Ledger {
		if Slot(sl) != slot {
			n -= m.st.Taken(Slot(sl))
		}
	}
	for _, h := range m.held {
		n -= h.n
	}
	m.st.setTaken(slot, max(n, 0))
}

// AcquireGrant takes one unit for s. Undoing the grant gives the unit back.
func (m *Semaphore) AcquireGrant(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (Grant, error) {
	m.mu.Lock()
	if m.dead != nil {
		m.mu.Unlock()
		return Grant{}, m.dead
	}
	free := m.claim()
	if m.dead != nil { // removed while claim waited
		m.commit(0)
		m.mu.Unlock()
		return Grant{}, m.dead
	}
	if free > 0 && m.waiters.len() == 0 {
		m.credit(s)
		m.commit(-1)
		m.mu.Unlock()
		return Grant{obj: m, sess: s, ok: true}, nil
	}
	if !block || timeout == 0 {
		m.commit(0)
		m.mu.Unlock()
		return Grant{}, nil
	}
	w := newWaiter(s, tid)
	m.waiters.push(w) // sets the daemon bit under the latch: no client op is in flight
	m.commit(0)
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

// debit takes one unit off slot's count: its daemon grants first, then the
// units it took by CAS. A session may release a unit it did not acquire (as
// with threading); that unit then comes off another holder's count, or the
// holder's session end would give it back a second time (and push a
// BoundedSemaphore over its bound). With no holder at all the release makes
// a new unit (total grows). Call it holding the latch.
func (m *Semaphore) debit(slot Slot) {
	if m.debitHeld(slot) {
		return
	}
	if n := m.st.Taken(slot); n > 0 {
		m.st.setTaken(slot, n-1)
		return
	}
	for sl := range m.held {
		if m.debitHeld(sl) {
			return
		}
	}
	for sl := range m.st.Ledger {
		if n := m.st.Taken(Slot(sl)); n > 0 {
			m.st.setTaken(Slot(sl), n-1)
			return
		}
	}
	m.total++
}

func (m *Semaphore) debitHeld(slot Slot) bool {
	h, ok := m.held[slot]
	if !ok {
		return false
	}
	if h.n--; h.n == 0 {
		delete(m.held, slot)
	} else {
		m.held[slot] = h
	}
	h.sess.unhold(m)
	return true
}

// holders reports whether anyone holds a unit (of the daemon's or by CAS);
// call it holding the latch.
func (m *Semaphore) holders() bool { return m.total > m.st.Free() }

// giveUnit hands one unit to the first waiter (returning 0) or returns 1,
// the unit to add to the free ones at commit.
func (m *Semaphore) giveUnit() int64 {
	if w := m.waiters.front(); w != nil {
		m.credit(w.sess)
		m.waiters.grant(w)
		return 0
	}
	return 1
}

// Release returns one unit. Any session may release (as threading); a
// BoundedSemaphore released above its initial value is ErrValue.
func (m *Semaphore) Release(s *Session, tid int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	free := m.claim()
	if m.dead != nil {
		m.commit(0)
		return m.dead
	}
	if !m.holders() {
		switch {
		case m.bounded:
			m.commit(0)
			return fmt.Errorf("%w: semaphore released too many times", ErrValue)
		case free >= MaxSemaphore:
			m.commit(0)
			return fmt.Errorf("%w: semaphore value would exceed %d", ErrValue, MaxSemaphore)
		}
	}
	m.debit(s.Slot())
	m.commit(m.giveUnit())
	return nil
}

func (m *Semaphore) undo(g *Grant) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held[g.sess.Slot()].n > 0 {
		m.claim()
		m.debitHeld(g.sess.Slot())
		m.commit(m.giveUnit())
	}
}

// Value returns the number of free units.
func (m *Semaphore) Value() int64 { return m.st.Free() }

// releaseSession gives back every unit s holds: the daemon's grants and
// the units its slot took by CAS (its ledger entry, recounted by claim
// when s died holding the latch).
func (m *Semaphore) releaseSession(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.claim()
	n := m.st.Taken(s.Slot())
	m.st.setTaken(s.Slot(), 0)
	var add int64
	for ; n > 0; n-- {
		add += m.giveUnit()
	}
	for m.debitHeld(s.Slot()) {
		add += m.giveUnit()
	}
	m.commit(add)
}

func (m *Semaphore) heldBy(n map[Slot]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for sl, h := range m.held {
		n[sl] += int(h.n)
	}
	for sl := range m.st.Ledger {
		if k := m.st.Taken(Slot(sl)); k > 0 {
			n[Slot(sl)] += int(k)
		}
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
