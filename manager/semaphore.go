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
	gone    func(Slot) bool           // whether the session of a slot has ended (fast path)
	pin     func(Slot) (func(), bool) // keeps a slot from reuse (fast path; see deferLatched)
	later   []func() int64            // give-backs waiting for a live holder's latch (see deferLatched)
	settler bool                      // a goroutine is waiting to run later
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
// session's op and taking over at once a latch that names no live attached
// session (one that ended mid-op, whose ledger entry it then recounts, or a
// stray store). It returns the free units and true; every such claim ends
// with commit. With a non-zero deadline it gives up when the deadline
// passes or ctx ends (a stopped holder), returning false with the latch not
// taken. While it waits it lets go of m.mu: ending the dead session, or
// deleting the object, must not wait for it (the session's end takes the
// manager's lock, which a Delete holds while it takes m.mu).
func (m *Semaphore) claim(ctx context.Context, deadline time.Time) (int64, bool) {
	pause := latchPause
	for spins := 0; ; spins++ {
		if free, ok := m.tryClaim(); ok {
			return free, true
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return 0, false
		}
		if ctx != nil && ctx.Err() != nil {
			return 0, false
		}
		if spins < 100 {
			runtime.Gosched()
			continue
		}
		m.mu.Unlock()
		time.Sleep(pause)
		m.mu.Lock()
		pause = min(pause*2, maxLatchPause) // a holder that stays (stopped) costs little CPU
	}
}

// latchPause and maxLatchPause bound the daemon's sleeps between looks at
// a latch a live session keeps.
const (
	latchPause    = 50 * time.Microsecond
	maxLatchPause = 5 * time.Millisecond
)

// tryClaim takes the latch if it can now (see claim), runs the give-backs
// that waited for it, and returns the free units.
func (m *Semaphore) tryClaim() (int64, bool) {
	x, ok := m.st.Claim(m.gone)
	if !ok {
		return 0, false
	}
	if p := Slot(x >> latchShift & slotMask); p != 0 && p != daemonLatch {
		m.recount(p)
	}
	m.runLater()
	return m.st.Free(), true
}

// claimNow is claim without a deadline, for the daemon's own ops that must
// happen (a release).
func (m *Semaphore) claimNow() int64 {
	free, _ := m.claim(nil, time.Time{})
	return free
}

// latchGrace bounds the wait of a non-blocking acquire for a latch a live
// session holds: that holder lets go within microseconds unless stopped.
const latchGrace = 2 * time.Millisecond

// deferLatched runs give (which returns units to add to the free ones)
// under the latch: now when the latch can be had at once, else as soon as
// the live session holding it lets go, from a goroutine of its own, so that
// a session's end never waits for another session's op on this semaphore.
// slot stays pinned (not reused) until give has run, since give reads and
// writes slot's ledger entry and daemon grants. Call with m.mu held.
func (m *Semaphore) deferLatched(slot Slot, give func() int64) {
	if _, ok := m.tryClaim(); ok {
		m.commit(give())
		return
	}
	unpin := func() {}
	if m.pin != nil {
		if u, ok := m.pin(slot); ok {
			unpin = u
		}
	}
	m.later = append(m.later, func() int64 {
		defer unpin()
		return give()
	})
	if !m.settler {
		m.settler = true
		go m.settle()
	}
}

// runLater runs the deferred give-backs; the caller holds the latch.
func (m *Semaphore) runLater() {
	if len(m.later) == 0 {
		return
	}
	later := m.later
	m.later = nil
	var add int64
	for _, f := range later {
		add += f()
	}
	m.st.addFree(add)
}

// settle waits for the latch and runs the deferred give-backs, or drops
// them (unpinning their slots) when the semaphore is removed: its units
// are forgotten with it.
func (m *Semaphore) settle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	pause := latchPause
	for len(m.later) > 0 && m.dead == nil {
		if _, ok := m.tryClaim(); ok {
			m.commit(0) // tryClaim ran them
			break
		}
		m.mu.Unlock()
		time.Sleep(pause)
		m.mu.Lock()
		pause = min(pause*2, maxLatchPause)
	}
	if m.dead != nil {
		for _, f := range m.later {
			f() // on Go memory now; unpins the slot
		}
		m.later = nil
	}
	m.settler = false
}

// commit adds delta to the free units and lets the latch go.
func (m *Semaphore) commit(delta int64) { m.st.Commit(delta) }

// recount sets the ledger entry of slot, whose session ended holding the
// latch, to what the total leaves for it: whichever step of its op it died
// at, the other entries, the daemon's grants and the free units are exact.
func (m *Semaphore) recount(slot Slot) {
	m.st.setTaken(slot, m.room(slot))
}

// room is what the total leaves for slot's ledger entry once the free
// units, the daemon's grants and every other entry are counted: the most
// units slot can hold by CAS. Call it holding the latch.
func (m *Semaphore) room(slot Slot) int64 {
	n := m.total - m.st.Free()
	for sl := range m.st.Ledger {
		if Slot(sl) != slot {
			n -= m.taken(Slot(sl))
		}
	}
	for _, h := range m.held {
		n -= h.n
	}
	return max(n, 0)
}

// taken is slot's ledger entry as read from the segment, clamped to the
// total: a word any process of the user can write is never trusted beyond
// what the semaphore has.
func (m *Semaphore) taken(slot Slot) int64 {
	return min(m.st.Taken(slot), m.total)
}

// AcquireGrant takes one unit for s. Undoing the grant gives the unit back.
func (m *Semaphore) AcquireGrant(ctx context.Context, s *Session, tid int64, block bool, timeout time.Duration) (Grant, error) {
	m.mu.Lock()
	if m.dead != nil {
		m.mu.Unlock()
		return Grant{}, m.dead
	}
	// The latch wait honours the request: a non-blocking acquire waits
	// latchGrace at most, a timed one until its deadline.
	deadline := time.Now().Add(latchGrace)
	if block && timeout != 0 {
		deadline = time.Time{}
		if timeout > 0 {
			deadline = time.Now().Add(timeout)
		}
	}
	free, ok := m.claim(ctx, deadline)
	if !ok {
		m.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return Grant{}, err
		}
		return Grant{}, nil // timed out behind a live holder's latch
	}
	if m.dead != nil { // removed while claim waited
		m.commit(0)
		m.mu.Unlock()
		return Grant{}, m.dead
	}
	if block && timeout > 0 {
		timeout = max(time.Until(deadline), time.Nanosecond) // what the latch wait left
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
	if n := m.taken(slot); n > 0 {
		m.st.setTaken(slot, n-1)
		return
	}
	for sl := range m.held {
		if m.debitHeld(sl) {
			return
		}
	}
	for sl := range m.st.Ledger {
		if n := m.taken(Slot(sl)); n > 0 {
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
func (m *Semaphore) giveUnit() int64 { return m.giveUnits(1) }

// giveUnits hands n units to the first waiters, one each, and returns the
// rest, to add to the free ones at commit: work in the number of waiters,
// never in n (which may come from a ledger entry).
func (m *Semaphore) giveUnits(n int64) int64 {
	for ; n > 0; n-- {
		w := m.waiters.front()
		if w == nil {
			break
		}
		m.credit(w.sess)
		m.waiters.grant(w)
	}
	return n
}

// Release returns one unit. Any session may release (as threading); a
// BoundedSemaphore released above its initial value is ErrValue.
func (m *Semaphore) Release(s *Session, tid int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	free := m.claimNow()
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
	slot := g.sess.Slot()
	if m.held[slot].n > 0 {
		m.deferLatched(slot, func() int64 {
			if m.held[slot].n == 0 {
				return 0
			}
			m.debitHeld(slot)
			return m.giveUnit()
		})
	}
}

// Value returns the number of free units.
func (m *Semaphore) Value() int64 { return m.st.Free() }

// releaseSession gives back every unit s holds: the daemon's grants and
// the units its slot took by CAS (its ledger entry, recounted by claim
// when s died holding the latch). The entry is read clamped to what the
// total leaves for it and given back in one sum. When a live session's op
// holds the latch, this is done once that op ends (deferLatched): the end
// of s never waits for another session.
func (m *Semaphore) releaseSession(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deferLatched(s.Slot(), func() int64 {
		n := min(m.taken(s.Slot()), m.room(s.Slot()))
		m.st.setTaken(s.Slot(), 0)
		for m.debitHeld(s.Slot()) {
			n++
		}
		return m.giveUnits(n)
	})
}

func (m *Semaphore) heldBy(n map[Slot]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for sl, h := range m.held {
		n[sl] += int(h.n)
	}
	for sl := range m.st.Ledger {
		if k := m.taken(Slot(sl)); k > 0 {
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
