package manager

import (
	"fmt"
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
//
// What differs from one family of objects to the next (which words it
// has, what a stray store can break in them, what a dead session leaves
// behind) is in the family's own file, behind fastFamily; this file and
// fastwait.go are the same for every family.

// fastFamily is one family of objects on the fast path: how a new object's
// state goes into shared memory and a removed object's comes back. A family
// whose objects have a slot of the segment is a wordFamily too, one whose
// objects have shared memory of their own a ringFamily. Each family is in
// a file of its own and has one line in fastFamilies.
type fastFamily interface {
	// kinds are the object kinds the family binds.
	kinds() []Kind
	// bind moves a new object's state into shared memory. It runs under
	// the manager's lock. Running out of room is not an error: the object
	// stays on the socket path.
	bind(f *fastPath, obj Object)
	// unbind gives a removed object's state back to Go memory. It runs
	// under the manager's lock, so it never waits for a client's latch.
	unbind(f *fastPath, obj Object)
}

// wordFamily is a family whose objects each have a slot of the segment,
// recorded by fastPath.remember (in byOff) while they are bound. Its
// methods run without f.mu.
type wordFamily interface {
	fastFamily
	// sweep repairs in obj's words what only a stray store can make (see
	// sweepFast); live reports whether a slot's session lives.
	sweep(obj Object, live func(Slot) bool)
	// sessionEnded gives back what s held in obj that no word naming s's
	// slot shows (a Semaphore's units). It runs when s ends, after every
	// word naming s's slot was released (see releaseSlotWords).
	sessionEnded(obj Object, s *Session)
	// waitOp is what a fast-path waiter on the family's words is said to
	// do in status listings ("acquire", "wait").
	waitOp() string
}

// ringFamily is a family whose objects have shared memory of their own,
// outside the segment (a Queue's ring).
type ringFamily interface {
	fastFamily
	// tick runs from the sweeper every sweepEvery, after sweepFast.
	tick(f *fastPath)
	// slotEnded releases what the session of slot held in the family's
	// memory. It runs when that session ends, after the segment's words
	// and waits naming the slot were released.
	slotEnded(f *fastPath, slot Slot)
}

// fastFamilies are the families on the fast path, one line each.
var fastFamilies = []fastFamily{
	lockFamily{},      // fast_lock.go: Lock
	rlockFamily{},     // fast_lock.go: RLock
	conditionFamily{}, // fast_lock.go: a Condition's private RLock
	semaphoreFamily{}, // fast_semaphore.go: Semaphore, BoundedSemaphore
	eventFamily{},     // fast_event_value.go: Event
	valueFamily{},     // fast_event_value.go: numeric Value
	queueFamily{},     // queue_ring_bind.go: Queue, JoinableQueue
}

// fastByKind is each kind's family, and ringFamilies the families with
// memory of their own, both from fastFamilies.
var fastByKind, ringFamilies = indexFamilies(fastFamilies)

func indexFamilies(fams []fastFamily) (map[Kind]fastFamily, []ringFamily) {
	byKind := make(map[Kind]fastFamily)
	var rings []ringFamily
	for _, fam := range fams {
		for _, k := range fam.kinds() {
			if byKind[k] != nil {
				panic(fmt.Sprintf("manager: two fast-path families for kind %q", k))
			}
			byKind[k] = fam
		}
		if r, ok := fam.(ringFamily); ok {
			rings = append(rings, r)
		}
	}
	return byKind, rings
}

// slotObject is an object with a slot of the segment, and its family.
type slotObject struct {
	obj Object
	fam wordFamily
}

// fastPath is the manager's segment and which object lives at which slot.
type fastPath struct {
	seg      *statemem.Segment
	slots    *Slots
	mu       sync.Mutex
	byOff    map[uint32]slotObject // objects whose words are in the segment
	refs     map[Object]statemem.Ref
	attached map[Slot]*Session // sessions whose end hook is registered, until it ran
	stop     chan struct{}     // closed by Manager.Close: ends the sweeper
	stopped  chan struct{}     // closed when the sweeper has ended
	queues   map[*Queue]*ringStore
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
	m.fast = &fastPath{seg: seg, slots: m.slots, byOff: make(map[uint32]slotObject), refs: make(map[Object]statemem.Ref), attached: make(map[Slot]*Session),
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
			for _, fam := range ringFamilies {
				fam.tick(f)
			}
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
// claim). The heir fields are repaired here, the rest by each family's
// sweep. It runs after every session end and every sweepEvery.
func (m *Manager) sweepFast(f *fastPath) {
	f.mu.Lock()
	objs := make([]slotObject, 0, len(f.byOff))
	var heirs []uint32 // offsets of the objects with an heir field
	for off, o := range f.byOff {
		objs = append(objs, o)
		if statemem.HasHeir(f.refs[o.obj].Kind()) {
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
		o.fam.sweep(o.obj, live)
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
// unit its ledger entries count is given back (the families'
// sessionEnded); then its waits and heir reservations end (endWaits), and
// what it held in rings (the ring families' slotEnded). It runs before the
// slot is unpinned, so no later session can be named by those words.
func (m *Manager) releaseSlotWords(f *fastPath, s *Session) {
	for _, off := range f.seg.Owned(uint32(s.Slot())) {
		f.mu.Lock()
		obj := f.byOff[off].obj
		f.mu.Unlock()
		if h, ok := obj.(holder); ok {
			h.releaseSession(s)
		}
	}
	// Every object, not only those whose words name the slot now: a
	// Semaphore whose latch another op just took over reads neither the
	// slot's latch nor its (not yet recounted) units.
	f.mu.Lock()
	objs := make([]slotObject, 0, len(f.byOff))
	for _, o := range f.byOff {
		objs = append(objs, o)
	}
	f.mu.Unlock()
	for _, o := range objs {
		o.fam.sessionEnded(o.obj, s)
	}
	f.endWaits(s)
	for _, fam := range ringFamilies {
		fam.slotEnded(f, s.Slot())
	}
	f.mu.Lock()
	delete(f.attached, s.Slot())
	f.mu.Unlock()
	m.sweepFast(f)
}

// bindFast moves a new object's words into the segment (or its state into
// memory of its own), as its family does it. A full segment is not an
// error: the object stays on the socket path.
func (m *Manager) bindFast(obj Object) {
	f := m.fast
	if f == nil {
		return
	}
	if fam := fastByKind[obj.Kind()]; fam != nil {
		fam.bind(f, obj)
	}
}

// bindWords moves obj's words into a new slot of kind (nil words are not
// obj's) and records it as fam's.
func (f *fastPath) bindWords(obj Object, fam wordFamily, kind uint8, mu *sync.Mutex, state, aux, since *Word) {
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
	f.remember(obj, fam, ref)
}

// remember records that obj's words, of family fam, are at ref.
func (f *fastPath) remember(obj Object, fam wordFamily, ref statemem.Ref) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.byOff[ref.Off] = slotObject{obj, fam}
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
// slot, as its family does it; a client still using the offset finds the
// daemon bit set and asks the daemon, which no longer knows the object.
func (m *Manager) unbindFast(obj Object) {
	f := m.fast
	if f == nil {
		return
	}
	if fam := fastByKind[obj.Kind()]; fam != nil {
		fam.unbind(f, obj)
	}
}

// unbindWords gives back the words bindWords bound.
func (f *fastPath) unbindWords(obj Object, mu *sync.Mutex, state, aux, since *Word) {
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
