package statemem

import (
	"sync/atomic"
	"time"
	"unsafe"
)

// Waits. A contended acquire (Lock, RLock, Semaphore) or Event wait sleeps
// on the word's futex for its whole timeout. The daemon learns who waits
// from the segment's waiter table: one record per session slot, of
// RecEntries entries, one per thread of the slot asleep in a fast-path
// wait (the object and since when; a thread that finds them all in use
// waits unrecorded). `status` lists them; when a session ends the daemon
// clears its record and wakes the sleepers of every lock word, so a killed
// waiter (who may have taken a release's one wake-up with it) strands no
// one.
//
// Locks and RLocks are barging locks with bounded unfairness, after Go's
// sync.Mutex: a free lock goes to whoever takes it first, but a waiter that
// has waited StarveAfter makes its slot the lock's heir (a u32 in the
// object slot), and then only the heir's slot may take the lock when it is
// free. A release wakes one sleeper, or, while there is an heir, the heir's
// sleepers alone (a futex wake bitset); whoever takes the lock after
// sleeping keeps BitWaiters set, so its own release wakes the next.
//
// Everything here is data to the daemon: record offsets are looked up in
// its own object table, counts are compared with 0 only.
const (
	// OffHeir: a Lock's, RLock's or Semaphore's heir, the u32 session slot
	// a starving waiter reserved the next free turn (or last free unit) for
	// (0: none).
	OffHeir = 48

	// HdrWaiters and HdrWaitersLen: where in the header the waiter
	// table's offset (bytes, 0 = no table) and its number of records are.
	HdrWaiters    = 24
	HdrWaitersLen = 28

	// RecEntries entries of EntrySize bytes make a slot's record (RecSize
	// bytes): u32 object offset, u32 in use (0/1), u64 since
	// (CLOCK_MONOTONIC ns).
	RecEntries = 4
	EntrySize  = 16
	RecSize    = RecEntries * EntrySize

	// WaitRecords is how many session slots (0 included, never used) the
	// daemon's table has records for; larger slot ids wait unrecorded.
	WaitRecords = 512

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

// WaitEntry is one entry of a session slot's waiter record, in shared
// memory: one thread's wait.
type WaitEntry struct {
	Off   uint32 // the object it sleeps on
	Used  uint32 // 1 while the entry is someone's
	Since uint64 // CLOCK_MONOTONIC ns at which the wait began
}

// WaitRecord is one session slot's waiter record.
type WaitRecord [RecEntries]WaitEntry

// AllocWaitTable gives the segment its waiter table: a run of fresh slots
// holding n records, named in the header. Call it once, before clients
// attach; a segment too small for the table keeps none (waits then go
// unrecorded and no waiter becomes an heir).
func (s *Segment) AllocWaitTable(n uint32) error {
	slots := (n*RecSize + SlotSize - 1) / SlotSize
	s.mu.Lock()
	if s.next+slots > s.cap {
		s.mu.Unlock()
		return ErrFull
	}
	first := s.next
	s.next += slots
	for i := first; i < first+slots; i++ {
		s.tagLocked(i, KindLedger) // not an object: its tag field stays a record's bytes
	}
	s.mu.Unlock()
	clear(s.mem[first*SlotSize : (first+slots)*SlotSize])
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.mem[HdrWaitersLen])), n)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.mem[HdrWaiters])), first*SlotSize)
	return nil
}

// WaitRecord returns slot's waiter record, or nil (no table, or a slot id
// past it). The header is read each time and bounds-checked: a client
// never trusts it further than its mapping.
func (s *Segment) WaitRecord(slot uint32) *WaitRecord {
	off := atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.mem[HdrWaiters])))
	n := atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.mem[HdrWaitersLen])))
	if off < SlotSize || off%SlotSize != 0 || slot == 0 || slot >= n ||
		uint64(off)+uint64(n)*RecSize > uint64(len(s.mem)) {
		return nil
	}
	return (*WaitRecord)(unsafe.Pointer(&s.mem[off+slot*RecSize])) //nolint:gosec // bounds checked above
}

// Waiting returns the entries of slot's record in use (copies).
func (s *Segment) Waiting(slot uint32) []WaitEntry {
	r := s.WaitRecord(slot)
	if r == nil {
		return nil
	}
	var out []WaitEntry
	for i := range r {
		e := &r[i]
		if atomic.LoadUint32(&e.Used) != 0 {
			out = append(out, WaitEntry{Off: atomic.LoadUint32(&e.Off), Used: 1, Since: atomic.LoadUint64(&e.Since)})
		}
	}
	return out
}

// ClearWaiting zeroes slot's record (its session ended).
func (s *Segment) ClearWaiting(slot uint32) {
	r := s.WaitRecord(slot)
	if r == nil {
		return
	}
	for i := range r {
		atomic.StoreUint32(&r[i].Used, 0)
		atomic.StoreUint32(&r[i].Off, 0)
		atomic.StoreUint64(&r[i].Since, 0)
	}
}

// Heir returns the heir field of the Lock or RLock at off.
func (s *Segment) Heir(off uint32) *uint32 { return (*uint32)(s.at(off, OffHeir)) }

// heirOf is the heir field beside a state word (w points into a segment's
// object slot, whose byte 48 it is).
func heirOf(w *uint64) *uint32 { return (*uint32)(unsafe.Add(unsafe.Pointer(w), OffHeir)) }

// Wait is one wait's state across the calls of an acquire loop (a caller
// that sleeps in slices, to watch a context, passes the same Wait to each).
// Its zero value waits unrecorded and never becomes an heir; Done must be
// called once the wait is over.
type Wait struct {
	Slot  uint32      // the waiter's session slot
	Rec   *WaitRecord // its slot's record (Segment.WaitRecord), or nil
	seg   *Segment
	start time.Time
	entry *WaitEntry // the entry of Rec this wait holds
	slept bool
	heir  bool
}

// enter takes a free entry of the waiter's record, once.
func (wt *Wait) enter(w *uint64) {
	if wt.start.IsZero() {
		wt.start = time.Now()
	}
	if wt.entry != nil || wt.Rec == nil || wt.seg == nil {
		return
	}
	for i := range wt.Rec {
		e := &wt.Rec[i]
		if atomic.CompareAndSwapUint32(&e.Used, 0, 1) {
			atomic.StoreUint32(&e.Off, uint32(uintptr(unsafe.Pointer(w))-uintptr(unsafe.Pointer(&wt.seg.mem[0]))))
			atomic.StoreUint64(&e.Since, MonoNow())
			wt.entry = e
			return
		}
	}
}

// Done ends a wait whose result was r: the waiter leaves its record, gives
// up the heir's place it took, and, when it slept and leaves without the
// lock, passes a wake-up on (a release wakes one sleeper, and that may
// have been this one).
func (wt *Wait) Done(w *uint64, r Result) {
	if wt.entry != nil {
		atomic.StoreUint32(&wt.entry.Off, 0)
		atomic.StoreUint32(&wt.entry.Used, 0)
		wt.entry = nil
	}
	if wt.heir {
		atomic.CompareAndSwapUint32(heirOf(w), wt.Slot, 0)
		wt.heir = false
	}
	if wt.slept && r != OK {
		WakeOne(w)
	}
}

// NewWait returns the Wait of slot in s (recorded when the table has room
// for slot).
func (s *Segment) NewWait(slot uint32) *Wait {
	return &Wait{Slot: slot, Rec: s.WaitRecord(slot), seg: s}
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

// releaseWake is the wake-up a release owes when the word had sleepers.
func releaseWake(w *uint64) {
	if atomic.LoadUint32(heirOf(w)) != 0 {
		wakeBits(w, wakeHeir)
	} else {
		WakeOne(w)
	}
}

// DropHeir clears an heir field that names slot (its session ended) and
// reports whether it did.
func DropHeir(heir *uint32, slot uint32) bool {
	return slot != 0 && atomic.CompareAndSwapUint32(heir, slot, 0)
}
