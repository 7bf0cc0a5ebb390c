package manager

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// The same-host fast path: the state words of Locks, RLocks, Events,
// numeric Values and Conditions' private locks live in a shared segment
// (package statemem), where clients on the daemon's host change them by
// compare-and-swap. The op semantics do not change: they already read and
// write that state only through the words of state.go, with the same CAS
// protocol the clients use. What this file adds is the binding of words to
// segment slots while an object lives, and the release, when a session
// ends, of the words that name its slot (a fast-path acquire does not go
// through the daemon, so the session's hold list does not know of it).

// fastPath is the manager's segment and which object lives at which slot.
type fastPath struct {
	seg      *statemem.Segment
	mu       sync.Mutex
	byOff    map[uint32]Object // objects whose words are in the segment
	refs     map[Object]statemem.Ref
	attached map[Slot]*Session // sessions whose end hook is registered, until it ran
	stop     chan struct{}     // closed by Manager.Close: ends the sweeper
	stopped  chan struct{}     // closed when the sweeper has ended
	queues   map[*Queue]*queueRing
	// perObject is the byte limit per object (a ring's inline limit).
	perObject int64
	maxItem   int64  // Config.MaxItemBytes
	ringBytes uint64 // each Queue ring's data capacity
}

// slotGone reports whether the session of slot has ended (or was never
// attached, so it cannot hold anything in the segment).
func (f *fastPath) slotGone(slot Slot) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.attached[slot]
	return s == nil || s.gone.Load()
}

// EnableFastPath binds the state words of objects created from now on into
// seg. Call it once, before serving clients.
func (m *Manager) EnableFastPath(seg *statemem.Segment) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fast = &fastPath{seg: seg, byOff: make(map[uint32]Object), refs: make(map[Object]statemem.Ref), attached: make(map[Slot]*Session),
		stop: make(chan struct{}), stopped: make(chan struct{}),
		perObject: m.cfg.MaxObjectBytes, maxItem: m.cfg.MaxItemBytes, ringBytes: queueRingBytes(m.cfg.QueueRingBytes)}
	allocWaitTable(seg)
	go m.sweeper(m.fast)
}

// sweepEvery is how often the daemon looks for stray words (see sweepFast)
// when no session ends.
const sweepEvery = time.Second

func (m *Manager) sweeper(f *fastPath) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	defer close(f.stopped)
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			m.sweepFast(f)
			f.trimQueues()
		}
	}
}

// sweepFast repairs words that a stray store (any process of the user can
// write the segment) left in a state the daemon never made, so that they
// break nothing for good: a Lock or RLock whose owner field names no live
// session's slot is handed on or freed as a dead owner's would be; a
// daemon bit with no daemon waiters queued is cleared; an heir field
// naming no live slot is cleared; a Semaphore latch
// naming no live attached session is taken over (and its books redone by
// claim). It runs after every session end and every sweepEvery.
func (m *Manager) sweepFast(f *fastPath) {
	f.mu.Lock()
	objs := make([]Object, 0, len(f.byOff))
	var heirs []uint32 // offsets of the objects with an heir field
	for off, o := range f.byOff {
		objs = append(objs, o)
		switch o.(type) {
		case *Lock, *RLock, *Semaphore:
			heirs = append(heirs, off)
		}
	}
	f.mu.Unlock()
	live := m.slots.Live
	// An heir field naming no live slot (a stray store; a dead session's is
	// dropped by endWaits) would keep the lock from every fast client.
	for _, off := range heirs {
		heir := f.seg.Heir(off)
		if h := atomic.LoadUint32(heir); h != 0 && !live(Slot(h)) && atomic.CompareAndSwapUint32(heir, h, 0) {
			statemem.WakeAll(f.seg.State(off))
		}
	}
	for _, o := range objs {
		switch o := o.(type) {
		case *Lock:
			o.mu.Lock()
			if p := o.st.Owner(); p != 0 && o.dead == nil && !live(p) {
				o.handOn()
			}
			o.waiters.clearStray()
			o.mu.Unlock()
		case *RLock:
			o.mu.Lock()
			if p, _, _ := o.st.Owner(); p != 0 && o.dead == nil && !live(p) {
				o.handOn()
			}
			o.waiters.clearStray()
			o.mu.Unlock()
		case *Event:
			o.mu.Lock()
			o.waiters.clearStray()
			o.mu.Unlock()
		case *Semaphore:
			o.mu.Lock()
			if o.dead == nil {
				if _, ok := o.tryClaim(); ok {
					o.waiters.clearStray()
					o.commit(0)
				}
			}
			o.mu.Unlock()
		}
	}
}

// clearStray clears the daemon bit of q's word when q is empty: the daemon
// did not set it (it sets it only while it has waiters queued), so a stray
// store did. Call with the object's mutex held (a Semaphore's latch too).
func (q *waitQueue) clearStray() {
	if q.word != nil && q.word.Bound() && q.l.Len() == 0 && q.word.Load()&waitersBit != 0 {
		q.word.setWaiters(false)
	}
}

// FastSegment returns the segment, or nil when the fast path is off.
func (m *Manager) FastSegment() *statemem.Segment {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.fast == nil {
		return nil
	}
	return m.fast.seg
}

// FastRef returns where obj's state words are: for a Condition, those of
// its lock. ok is false when obj is not on the fast path (the kind has no
// shared word, the segment was full, or the fast path is off).
func (m *Manager) FastRef(obj Object) (statemem.Ref, bool) {
	if c, ok := obj.(*Condition); ok {
		obj = c.lock.(Object)
	}
	m.mu.RLock()
	f := m.fast
	m.mu.RUnlock()
	if f == nil {
		return statemem.Ref{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.refs[obj]
	return r, ok
}

// AttachFastPath registers, once per session, the end hook that releases
// the words naming s's slot. A session must be attached before it is given
// any offset. It reports false when the fast path is off or s has ended.
func (m *Manager) AttachFastPath(s *Session) bool {
	m.mu.RLock()
	f := m.fast
	m.mu.RUnlock()
	if f == nil || s.Slot() > Slot(statemem.MaxSlot) {
		return false
	}
	f.mu.Lock()
	if f.attached[s.Slot()] == s {
		f.mu.Unlock()
		return true
	}
	f.attached[s.Slot()] = s
	f.mu.Unlock()
	if !s.OnEnd(func() { m.releaseSlotWords(f, s) }) {
		f.mu.Lock()
		delete(f.attached, s.Slot())
		f.mu.Unlock()
		return false
	}
	return true
}

// releaseSlotWords runs when s ends: every Lock and RLock whose word names
// s's slot is handed on (to the next daemon waiter) or freed (waking the
// futex sleepers), as the session's own holds were, and every Semaphore
// unit its ledger entries count is given back. It runs before the slot is
// unpinned, so no later session can be named by those words.
func (m *Manager) releaseSlotWords(f *fastPath, s *Session) {
	for _, off := range f.seg.Owned(uint32(s.Slot())) {
		f.mu.Lock()
		obj := f.byOff[off]
		f.mu.Unlock()
		if h, ok := obj.(holder); ok {
			h.releaseSession(s)
		}
	}
	// Every Semaphore, not only those whose words name the slot now: a
	// Semaphore whose latch another op just took over reads neither the
	// slot's latch nor its (not yet recounted) units.
	f.mu.Lock()
	var sems []*Semaphore
	for _, obj := range f.byOff {
		if sem, ok := obj.(*Semaphore); ok {
			sems = append(sems, sem)
		}
	}
	f.mu.Unlock()
	for _, sem := range sems {
		sem.releaseSession(s)
	}
	f.endWaits(s)
	f.releaseQueueSlots(s.Slot())
	f.mu.Lock()
	delete(f.attached, s.Slot())
	f.mu.Unlock()
	m.sweepFast(f)
}

// bindFast moves a new object's words into the segment. A full segment is
// not an error: the object stays on the socket path.
func (m *Manager) bindFast(obj Object) {
	f := m.fast
	if f == nil {
		return
	}
	switch o := obj.(type) {
	case *Lock:
		f.bind(o, statemem.KindLock, &o.mu, &o.st.W0, &o.st.TID, &o.st.Since)
	case *RLock:
		f.bind(o, statemem.KindRLock, &o.mu, &o.st.W0, &o.st.TID, &o.st.Since)
	case *Event:
		f.bind(o, statemem.KindEvent, &o.mu, &o.st.W0, nil, nil)
	case *Semaphore:
		m.bindSemaphore(f, o)
	case *Queue:
		f.bindQueue(o, f.perObject)
	case *Value:
		if o.numeric() {
			f.bind(o, statemem.KindValue, &o.mu, nil, &o.cell.Bits, nil)
		}
	case *Condition:
		if r, ok := o.lock.(*RLock); ok && r.name == o.name+".lock" {
			f.bind(r, statemem.KindRLock, &r.mu, &r.st.W0, &r.st.TID, &r.st.Since)
		}
	}
}

func (f *fastPath) bind(obj Object, kind uint8, mu *sync.Mutex, state, aux, since *Word) {
	ref, err := f.seg.Alloc(kind, 0, 0)
	if err != nil {
		return
	}
	mu.Lock()
	if state != nil {
		state.Bind(f.seg.State(ref.Off))
	}
	if aux != nil {
		aux.Bind(f.seg.Aux(ref.Off))
	}
	if since != nil {
		since.Bind(f.seg.Since(ref.Off))
	}
	mu.Unlock()
	f.remember(obj, ref)
}

// remember records that obj's words are at ref.
func (f *fastPath) remember(obj Object, ref statemem.Ref) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.byOff[ref.Off] = obj
	f.refs[obj] = ref
}

// forget drops obj's record and returns where its words were.
func (f *fastPath) forget(obj Object) (statemem.Ref, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ref, ok := f.refs[obj]
	if ok {
		delete(f.refs, obj)
		delete(f.byOff, ref.Off)
	}
	return ref, ok
}

// unbindFast gives a removed object's words back to Go memory and frees its
// slot; a client still using the offset finds the daemon bit set and asks
// the daemon, which no longer knows the object.
func (m *Manager) unbindFast(obj Object) {
	f := m.fast
	if f == nil {
		return
	}
	switch o := obj.(type) {
	case *Lock:
		f.unbind(o, &o.mu, &o.st.W0, &o.st.TID, &o.st.Since)
	case *RLock:
		f.unbind(o, &o.mu, &o.st.W0, &o.st.TID, &o.st.Since)
	case *Event:
		f.unbind(o, &o.mu, &o.st.W0, nil, nil)
	case *Semaphore:
		f.unbindSemaphore(o)
	case *Queue:
		f.unbindQueue(o)
	case *Value:
		f.unbind(o, &o.mu, nil, &o.cell.Bits, nil)
	case *Condition:
		if r, ok := o.lock.(*RLock); ok && r.name == o.name+".lock" {
			f.unbind(r, &r.mu, &r.st.W0, &r.st.TID, &r.st.Since)
		}
	}
}

func (f *fastPath) unbind(obj Object, mu *sync.Mutex, state, aux, since *Word) {
	ref, ok := f.forget(obj)
	if !ok {
		return
	}
	mu.Lock()
	statemem.MarkDaemon(f.seg.State(ref.Off))
	if state != nil {
		state.Unbind()
		state.update(func(x uint64) uint64 { return x &^ (waitersBit | sleepersBit) })
	}
	if aux != nil {
		aux.Unbind()
	}
	if since != nil {
		since.Unbind()
	}
	mu.Unlock()
	f.seg.Free(ref.Off)
}

// bindSemaphore moves a Semaphore's word into the segment and gives it a
// ledger there.
func (m *Manager) bindSemaphore(f *fastPath, o *Semaphore) {
	kind, bound := statemem.KindSemaphore, uint64(0)
	if o.bounded {
		kind, bound = statemem.KindBoundedSemaphore, uint64(o.initial)
	}
	ref, err := f.seg.AllocSemaphore(kind, 0, bound)
	if err != nil {
		return
	}
	o.mu.Lock()
	o.st.W0.Bind(f.seg.State(ref.Off))
	o.st.Ledger = f.seg.LedgerEntries(ref.Off)
	o.gone = f.slotGone
	o.pin = m.slots.Pin
	o.mu.Unlock()
	f.remember(o, ref)
}

// unbindSemaphore takes a removed Semaphore off the segment. It runs under
// the manager's lock, so it never waits for the latch: when a client op is
// in flight, the slot and the ledger are retired for good (never handed out
// again) instead of freed, so that the op's late writes land nowhere
// anyone reads. The units clients took by CAS are forgotten with the object.
func (f *fastPath) unbindSemaphore(o *Semaphore) {
	ref, ok := f.forget(o)
	if !ok {
		return
	}
	o.mu.Lock()
	inFlight := o.st.Latched() != 0
	statemem.MarkDaemon(f.seg.State(ref.Off))
	o.st.W0.Unbind()
	o.st.W0.update(func(x uint64) uint64 { return x &^ (latchMask | waitersBit | sleepersBit) })
	o.st.Ledger = nil
	o.gone = nil
	o.pin = nil
	o.mu.Unlock()
	if inFlight {
		f.seg.Retire(ref.Off)
	} else {
		f.seg.Free(ref.Off)
	}
}
