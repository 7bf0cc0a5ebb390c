package manager

import (
	"runtime"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// A Queue's ring: its size, its binding to a new Queue and its release, the
// Queue family on the fast path, the sessions it was passed to, and status.

// DefaultQueueRingBytes is the data capacity of each Queue's ring unless
// Config.QueueRingBytes says otherwise; an item of more than a quarter of
// it is kept by the daemon (see ringStore.ext). The ring's memory file is
// sparse: a queue of small items touches only the ring's hot window
// (statemem.RingHot), and the sweeper gives back the pages past it once the
// ring is empty and idle (trimQueues). MaxQueueRings bounds the rings (each
// holds a descriptor and its mapping in the daemon); later Queues keep
// their items in the daemon.
const (
	DefaultQueueRingBytes = 64 << 20
	MaxQueueRings         = 1024
)

// queueRingBytes is the ring capacity for a configured size: the default
// for 0, else the power of two at or above it, at most
// statemem.RingMaxCapacity.
func queueRingBytes(n int64) uint64 {
	if n <= 0 {
		n = DefaultQueueRingBytes
	}
	return statemem.RingSize(n)
}

// queueFamily is the fast-path family of Queues and JoinableQueues (see
// fastFamily): each has a ring of its own, outside the segment.
type queueFamily struct{}

func (queueFamily) kinds() []Kind { return []Kind{KindQueue, KindJoinableQueue} }

func (queueFamily) bind(f *fastPath, obj Object) { f.bindQueue(obj.(*Queue), f.perObject) }

func (queueFamily) unbind(f *fastPath, obj Object) { f.unbindQueue(obj.(*Queue)) }

func (queueFamily) tick(f *fastPath) { f.trimQueues() }

func (queueFamily) slotEnded(f *fastPath, slot Slot) { f.releaseQueueSlots(slot) }

// trimQueues gives back the pages past the hot window of every ring that
// was empty and unchanged since the sweeper's previous look (the sweeper
// calls it every sweepEvery). It never waits for a latch.
func (f *fastPath) trimQueues() {
	f.mu.Lock()
	rings := make([]*ringStore, 0, len(f.queues))
	for _, qr := range f.queues {
		rings = append(rings, qr)
	}
	f.mu.Unlock()
	for _, qr := range rings {
		seq, _, _ := qr.r.Trim(qr.idle.Load()) // an error (none expected from tmpfs) leaves the pages: harmless
		qr.idle.Store(seq)
	}
}

// bindQueue gives a new Queue or JoinableQueue a ring (a JoinableQueue's
// task counts are in it too: queue_owed.go). A failure is not an error: the
// queue keeps its items in the daemon.
func (f *fastPath) bindQueue(q *Queue, perObject int64) {
	// A ring holds at most --max-object-bytes (rounded down to a power of
	// two): what clients put into it is not charged one by one, and what
	// the daemon adds is charged with the ring's bytes counted (ringStore.charge).
	capacity := f.ringBytes
	for perObject > 0 && capacity > 4096 && capacity > uint64(perObject) {
		capacity >>= 1
	}
	inline := capacity / 4
	if perObject > 0 && uint64(perObject-ItemOverhead) < inline {
		if perObject <= ItemOverhead {
			return
		}
		inline = uint64(perObject - ItemOverhead)
	}
	if f.maxItem > 0 && uint64(f.maxItem) < inline {
		inline = uint64(f.maxItem) // every ring item fits a reply frame
	}
	maxsize := uint64(0)
	if q.maxsize > 0 {
		maxsize = uint64(q.maxsize)
	}
	f.mu.Lock()
	full := len(f.queues) >= MaxQueueRings
	f.mu.Unlock()
	if full {
		return
	}
	r, err := statemem.NewRing(capacity, maxsize, inline)
	if err != nil {
		return
	}
	qr := &ringStore{name: q.name, q: q, r: r, ext: make(map[uint64][]byte), wch: make(chan struct{}),
		gone: func(s uint32) bool { return f.slotGone(Slot(s)) }}
	// The ring store takes the place of the list store, which holds
	// nothing: bindFast binds a Queue as it is created, before anyone can
	// use it.
	q.mu.Lock()
	q.store = qr
	q.mu.Unlock()
	f.mu.Lock()
	if f.queues == nil {
		f.queues = make(map[*Queue]*ringStore)
	}
	f.queues[q] = qr
	f.mu.Unlock()
}

// unbindQueue closes a removed Queue's ring (clients' maps stay valid and
// find its daemon flag set).
func (f *fastPath) unbindQueue(q *Queue) {
	f.mu.Lock()
	qr := f.queues[q]
	delete(f.queues, q)
	f.mu.Unlock()
	if qr != nil {
		_ = qr.r.Close()
	}
}

// Ring returns the Queue's ring, or nil when its items are in the daemon.
func (q *Queue) Ring() *statemem.Ring {
	q.mu.Lock()
	defer q.mu.Unlock()
	qr, ok := q.store.(*ringStore) // the ring store's own accessor
	if !ok || q.dead != nil {
		return nil
	}
	return qr.r
}

// QueueWaiting is a fast-path client's thread asleep on a Queue's ring.
type QueueWaiting struct {
	Session uint64
	Kind    string // wire kind: "queue" or "joinable_queue"
	Name    string
	Op      string    // "get", "put" or "join" ("" unknown)
	Since   time.Time // zero: unknown
	Count   int       // threads of that session waiting so
}

// QueueWaiting lists the sessions asleep on Queue rings now, for status.
func (m *Manager) QueueWaiting() []QueueWaiting {
	m.mu.RLock()
	f := m.fast
	m.mu.RUnlock()
	if f == nil {
		return nil
	}
	f.mu.Lock()
	rings := make([]*ringStore, 0, len(f.queues))
	for _, qr := range f.queues {
		rings = append(rings, qr)
	}
	f.mu.Unlock()
	var out []QueueWaiting
	for _, qr := range rings {
		for _, w := range qr.r.Waiters() {
			f.mu.Lock()
			s := f.attached[Slot(w.Slot)]
			f.mu.Unlock()
			if s == nil {
				continue
			}
			op := map[uint32]string{statemem.RingWaitGet: "get", statemem.RingWaitPut: "put", statemem.RingWaitJoin: "join"}[w.Op]
			kind := "queue"
			if qr.q.joinable {
				kind = "joinable_queue"
			}
			out = append(out, QueueWaiting{Session: s.ID, Kind: kind, Name: qr.name, Op: op, Since: w.Since, Count: w.Count})
		}
	}
	return out
}

// RingPassed records that the session in slot was given q's ring (a
// queue_attach, just before the reply that carries it): from now on the
// ring may change without the daemon, so its daemon waiters need the
// watcher (ringStore.wait) until that session ends.
func (q *Queue) RingPassed(slot Slot) {
	q.mu.Lock()
	qr, ok := q.store.(*ringStore) // only a ring is passed to clients
	q.mu.Unlock()
	if !ok {
		return
	}
	qr.wmu.Lock()
	defer qr.wmu.Unlock()
	if qr.users == nil {
		qr.users = make(map[uint32]struct{})
	}
	qr.users[uint32(slot)] = struct{}{}
	if qr.wn > 0 {
		qr.startWatch(qr.r.Seq())
	}
}

// Busy reports whether an op on q would wait now for another holder: its
// mutex, or its ring's latch, held throughout spin (an op holds either
// for moments; one held longer is a descheduled, stopped or misbehaving
// holder, which the op would wait out for up to statemem.LatchWait).
func (q *Queue) Busy(spin time.Duration) bool {
	if q.free() {
		return false
	}
	deadline := time.Now().Add(spin)
	for time.Now().Before(deadline) {
		runtime.Gosched()
		if q.free() {
			return false
		}
	}
	return true
}

// QueueBusy is Queue.Busy for the object called name; false when that is
// not a Queue.
func (m *Manager) QueueBusy(name string, spin time.Duration) bool {
	obj, err := m.lookupAny(name)
	if err != nil {
		return false
	}
	q, ok := obj.(*Queue)
	return ok && q.Busy(spin)
}

// free reports whether q's mutex and its ring's latch are free now.
func (q *Queue) free() bool {
	if !q.mu.TryLock() {
		return false
	}
	qr, _ := q.store.(*ringStore)
	q.mu.Unlock()
	return qr == nil || !qr.r.Latched()
}

// HasRing reports whether the session in slot was given q's ring and
// lives: its client can take the ring's items from shared memory itself.
func (q *Queue) HasRing(slot Slot) bool {
	q.mu.Lock()
	qr, ok := q.store.(*ringStore)
	q.mu.Unlock()
	if !ok || slot == 0 {
		return false
	}
	qr.wmu.Lock()
	defer qr.wmu.Unlock()
	_, user := qr.users[uint32(slot)]
	return user
}

// releaseQueueSlots lets go of the latch and the waiter counts of a
// session that ended, on every ring, and forgets it as a user of each. It
// takes no lock the daemon's ops hold while they wait for a latch.
func (f *fastPath) releaseQueueSlots(slot Slot) {
	f.mu.Lock()
	rings := make([]*ringStore, 0, len(f.queues))
	for _, qr := range f.queues {
		rings = append(rings, qr)
	}
	f.mu.Unlock()
	for _, qr := range rings {
		qr.wmu.Lock()
		_, user := qr.users[uint32(slot)]
		delete(qr.users, uint32(slot))
		qr.wmu.Unlock()
		if qr.r.ReleaseLatch(uint32(slot)) || user {
			// What the session (or the daemon for it) changed last may be
			// news to the daemon's waiters, and the watcher may stop now.
			qr.wakeLocal()
		}
		if q := qr.q; q.joinable && slot < statemem.RingSlots {
			q.mu.Lock()
			qr.releaseOwed(uint32(slot), nil)
			q.mu.Unlock()
		}
	}
}
