package statemem

import (
	"sync/atomic"
	"time"
	"unsafe"
)

// Waits. A contended acquire (Lock, RLock, Semaphore) or Event wait sleeps
// on the word's futex for its whole timeout. The daemon learns who waits
// from the segment's waiter table: a pool of entries shared by every
// session slot, one per thread asleep in a fast-path wait (the object, the
// session slot, since when). A thread takes any free entry, so a process
// may have as many waits recorded as the pool has free entries, whatever
// its slot id; a thread that finds none free waits unrecorded and counts
// itself in the header's unrecorded count while it waits. `status` lists
// the entries; when a session ends the daemon frees its entries and wakes
// the sleepers of every word they name (of every lock word while the
// unrecorded count is not 0), so a killed waiter (who may have taken a
// release's one wake-up with it) strands no one.
//
// Locks and RLocks are barging locks with bounded unfairness, after Go's
// sync.Mutex: a free lock goes to whoever takes it first, but a waiter that
// has waited StarveAfter makes its slot the lock's heir (a u32 in the
// object slot), and then only the heir's slot may take the lock when it is
// free. A release wakes one sleeper, or, while there is an heir, the heir's
// sleepers alone (a futex wake bitset); whoever takes the lock after
// sleeping keeps BitWaiters set, so its own release wakes the next.
//
// Everything here is data to the daemon: entry offsets are looked up in
// its own object table, entry slots in its own table of sessions, counts
// are compared with 0 only.
const (
	// OffHeir: a Lock's, RLock's or Semaphore's heir, the u32 session slot
	// a starving waiter reserved the next free turn (or last free unit) for
	// (0: none).
	OffHeir = 48

	// HdrWaiters and HdrWaitersLen: where in the header the waiter
	// table's offset (bytes, 0 = no table) and its number of entries are.
	// HdrUnrecorded: the u32 count of waits asleep with no entry (the
	// table was full when they began).
	HdrWaiters    = 24
	HdrWaitersLen = 28
	HdrUnrecorded = 32

	// EntrySize is the size of an entry: u32 object offset, u32 session
	// slot (0 = free), u64 since (CLOCK_MONOTONIC ns).
	EntrySize = 16

	// WaitEntries is how many entries the daemon's table has (fewer in a
	// small segment): 2,048 waits asleep at once, in 512 object slots.
	WaitEntries = 2048

	// StarveAfter is how long a waiter waits before it becomes the heir
	// (Go's sync.Mutex: 1 ms).
	StarveAfter = time.Millisecond

	// ReservedNap bounds the sleep of a waiter that finds a lock free but
	// reserved for another slot's heir.
	ReservedNap = 2 * time.Millisecond

	// Futex wake bitsets: every sleeper matches wakeNormal; the heir's
	// sleep matches wakeHeir too.
	wakeNormal = 1
	wakeHeir   = 2
)

// WaitEntry is one entry of the waiter table, in shared memory: one
// thread's wait.
type WaitEntry struct {
	Off   uint32 // the object it sleeps on
	Slot  uint32 // the waiter's session slot; 0 while the entry is free
	Since uint64 // CLOCK_MONOTONIC ns at which the wait began
}

// AllocWaitTable gives the segment its waiter table: a run of fresh slots
// holding n entries, named in the header. Call it once, before clients
// attach; a segment too small for the table keeps none (waits then go
// unrecorded and no waiter becomes an heir).
func (s *Segment) AllocWaitTable(n uint32) error {
	slots := (n*EntrySize + SlotSize - 1) / SlotSize
	s.mu.Lock()
	if s.next+slots > s.cap {
		s.mu.Unlock()
		return ErrFull
	}
	first := s.next
	s.next += slots
	for i := first; i < first+slots; i++ {
		s.tagLocked(i, KindLedger) // not an object: its tag field stays an entry's bytes
	}
	s.mu.Unlock()
	clear(s.mem[first*SlotSize : (first+slots)*SlotSize])
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.mem[HdrWaitersLen])), n)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.mem[HdrWaiters])), first*SlotSize)
	return nil
}

// WaitTable returns the waiter table's entries, or nil (no table). The
// header is read each time and bounds-checked: a client never trusts it
// further than its mapping.
func (s *Segment) WaitTable() []WaitEntry {
	off := atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.mem[HdrWaiters])))
	n := atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.mem[HdrWaitersLen])))
	if off < SlotSize || off%SlotSize != 0 || n == 0 ||
		uint64(off)+uint64(n)*EntrySize > uint64(len(s.mem)) {
		return nil
	}
	return unsafe.Slice((*WaitEntry)(unsafe.Pointer(&s.mem[off])), n) //nolint:gosec // bounds checked above
}

// unrecorded is the header's count of waits asleep without an entry.
func (s *Segment) unrecorded() *uint32 {
	return (*uint32)(unsafe.Pointer(&s.mem[HdrUnrecorded]))
}

// Unrecorded reports whether any wait is (or, for a waiter killed while
// unrecorded, was) asleep without an entry of the table.
func (s *Segment) Unrecorded() bool { return atomic.LoadUint32(s.unrecorded()) != 0 }

// Waits returns the entries in use (copies).
func (s *Segment) Waits() []WaitEntry {
	var out []WaitEntry
	for i, tbl := 0, s.WaitTable(); i < len(tbl); i++ {
		e := &tbl[i]
		if slot := atomic.LoadUint32(&e.Slot); slot != 0 {
			out = append(out, WaitEntry{Off: atomic.LoadUint32(&e.Off), Slot: slot, Since: atomic.LoadUint64(&e.Since)})
		}
	}
	return out
}

// Waiting returns the entries slot's waits hold (copies).
func (s *Segment) Waiting(slot uint32) []WaitEntry {
	var out []WaitEntry
	for _, e := range s.Waits() {
		if e.Slot == slot {
			out = append(out, e)
		}
	}
	return out
}

// ClearWaiting frees slot's entries (its session ended).
func (s *Segment) ClearWaiting(slot uint32) {
	if slot == 0 {
		return
	}
	for i, tbl := 0, s.WaitTable(); i < len(tbl); i++ {
		atomic.CompareAndSwapUint32(&tbl[i].Slot, slot, 0)
	}
}

// Heir returns the heir field of the Lock or RLock at off.
func (s *Segment) Heir(off uint32) *uint32 { return (*uint32)(s.at(off, OffHeir)) }

// HasHeir reports whether the objects of kind (a tag's kind code) have an
// heir field: Locks, RLocks, Semaphores and BoundedSemaphores.
func HasHeir(kind uint8) bool {
	switch kind {
	case KindLock, KindRLock, KindSemaphore, KindBoundedSemaphore:
		return true
	}
	return false
}

// heirOf is the heir field beside a state word (w points into a segment's
// object slot, whose byte 48 it is).
func heirOf(w *uint64) *uint32 { return (*uint32)(unsafe.Add(unsafe.Pointer(w), OffHeir)) }

// Wait is one wait's state across the calls of an acquire loop (a caller
// that sleeps in slices, to watch a context, passes the same Wait to each).
// Its zero value waits unrecorded and never becomes an heir; Done must be
// called once the wait is over.
type Wait struct {
	Slot       uint32 // the waiter's session slot
	seg        *Segment
	start      time.Time
	entry      *WaitEntry // the table entry this wait holds
	unrecorded bool       // counted in the header's unrecorded count instead
	latchSince time.Time  // when a Semaphore op first waited for another's latch
	slept      bool
	heir       bool
}

// enter takes a free entry of the table for this wait, once, looking from
// a place that depends on the slot so that processes seldom race for one.
func (wt *Wait) enter(w *uint64) {
	if wt.start.IsZero() {
		wt.start = time.Now()
	}
	if wt.entry != nil || wt.unrecorded || wt.seg == nil || wt.Slot == 0 {
		return
	}
	tbl := wt.seg.WaitTable()
	if len(tbl) == 0 {
		return
	}
	n := uint32(len(tbl))
	for i, at := uint32(0), wt.Slot*4%n; i < n; i, at = i+1, (at+1)%n {
		e := &tbl[at]
		if atomic.LoadUint32(&e.Slot) == 0 && atomic.CompareAndSwapUint32(&e.Slot, 0, wt.Slot) {
			atomic.StoreUint32(&e.Off, uint32(uintptr(unsafe.Pointer(w))-uintptr(unsafe.Pointer(&wt.seg.mem[0]))))
			atomic.StoreUint64(&e.Since, MonoNow())
			wt.entry = e
			return
		}
	}
	atomic.AddUint32(wt.seg.unrecorded(), 1)
	wt.unrecorded = true
}

// Done ends a wait whose result was r: the waiter leaves its entry (only
// if it is still its own: the daemon frees an ended session's entries),
// gives up the heir's place it took, and, when it slept and leaves without
// the lock, passes a wake-up on (a release wakes one sleeper, and that may
// have been this one).
func (wt *Wait) Done(w *uint64, r Result) {
	if wt.entry != nil {
		atomic.CompareAndSwapUint32(&wt.entry.Slot, wt.Slot, 0)
		wt.entry = nil
	}
	if wt.unrecorded {
		u := wt.seg.unrecorded()
		for v := atomic.LoadUint32(u); v != 0 && !atomic.CompareAndSwapUint32(u, v, v-1); v = atomic.LoadUint32(u) {
		}
		wt.unrecorded = false
	}
	if wt.heir {
		atomic.CompareAndSwapUint32(heirOf(w), wt.Slot, 0)
		wt.heir = false
	}
	if wt.slept && r != OK {
		WakeOne(w)
	}
}

// NewWait returns the Wait of slot in s (recorded while the table has a
// free entry).
func (s *Segment) NewWait(slot uint32) *Wait {
	return &Wait{Slot: slot, seg: s}
}

// heirTurn is one contended turn of a Lock's, RLock's or Semaphore's
// acquire loop: it makes the waiter the heir once it has waited StarveAfter
// (then reports true at once, to look at the word again), else sleeps on
// the word (the heir so that a Lock's release in starvation mode wakes it).
// reserved: what the caller wants is there but kept for another slot's
// heir. It reports false when the call must not wait or the deadline has
// passed.
func heirTurn(w *uint64, x uint64, timeout time.Duration, deadline time.Time, wt *Wait, reserved bool) bool {
	if timeout == 0 {
		return false
	}
	wt.enter(w)
	bits := uint32(wakeNormal)
	if wt.Slot != 0 {
		heir := heirOf(w)
		h := atomic.LoadUint32(heir)
		if h == 0 && time.Since(wt.start) >= StarveAfter && atomic.CompareAndSwapUint32(heir, 0, wt.Slot) {
			wt.heir = true
			return true
		}
		if h == wt.Slot {
			bits |= wakeHeir
		}
	}
	if reserved {
		// Free but reserved for another slot's heir: its wake-up is not
		// ours to wait for (the heir may leave or die without one), so look
		// again within ReservedNap.
		nap := time.Now().Add(ReservedNap)
		if deadline.IsZero() || nap.Before(deadline) {
			sleepBits(w, x, nap, bits, wt)
			return true
		}
	}
	return sleepBits(w, x, deadline, bits, wt)
}

// mayTake reports whether slot may take a free lock whose heir field reads h.
func mayTake(h, slot uint32) bool { return h == 0 || h == slot }

// heirServed ends the heir's reservation once its slot took the lock.
func heirServed(w *uint64, h uint32, wt *Wait) {
	if h != 0 {
		atomic.CompareAndSwapUint32(heirOf(w), h, 0)
		wt.heir = false
	}
}

// releaseWake is the wake-up a release owes when the word had sleepers:
// the heir's sleepers while there is an heir, else (or when none of them
// was asleep: the heir may be between two looks) one sleeper, so that a
// release that cleared BitWaiters never leaves a sleeper without a wake-up.
func releaseWake(w *uint64) {
	if atomic.LoadUint32(heirOf(w)) != 0 && wakeBits(w, wakeHeir) > 0 {
		return
	}
	WakeOne(w)
}

// DropHeir clears an heir field that names slot (its session ended) and
// reports whether it did.
func DropHeir(heir *uint32, slot uint32) bool {
	return slot != 0 && atomic.CompareAndSwapUint32(heir, slot, 0)
}
