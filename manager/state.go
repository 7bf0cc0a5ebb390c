package manager

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// This file holds the state words of the objects whose state is small enough
// to live in one or two machine words: Lock, RLock, Semaphore,
// BoundedSemaphore and Event, and the value cell of Value. The op semantics
// (lock.go, semaphore.go, event.go, value.go) read and write that state only
// through these types, so that the words can move into shared memory without
// touching the semantics.
//
// Today every word is backed by a field of the object (Go memory), and every
// transition happens under the object's mutex; the words are nevertheless
// read and written with sync/atomic, so a reader outside the mutex (Event's
// IsSet) and, later, a process mapping the word sees a consistent value.
//
// Shared-memory layout: see statemem/layout.go and docs/protocol.md
// ("Same-host fast path"). The bits of a state word:
//
//	Lock             W0: bits 0-28 owner slot (0 = unlocked)
//	                 TID: owner's thread id (informational; any thread may release)
//	RLock            W0: bits 0-28 owner slot, bits 32-63 recursion depth
//	                 TID: owner's thread id (cleared before the owner changes)
//	Event            W0: bit 0 flag, bits 1-28 generation (bumped by every set)
//	every kind above W0: bit 29 futex sleepers (statemem.BitWaiters),
//	                     bit 30 the daemon has waiters queued (statemem.BitDaemon)
//	Semaphore        W0: bits 0-28 free units, bits 32-60 the latch (the
//	                     slot whose op is in flight); Ledger: units per slot
//	                     taken by compare-and-swap (statemem.SemAcquire)
//	Value            Bits: the value's 8 bytes (int64, uint64, float64 bits,
//	                     0/1 for '?'), changed only by atomic store or CAS.
//	                     Typecodes 'c' and 'O' have no cell.
//
// A fast-path client changes a word with one compare-and-swap while the
// daemon bit is clear, and sleeps on it with a futex; with the bit set it
// sends the op to the daemon, which parks waiters FIFO as for any client.
// Whoever frees a word that has the futex-sleepers bit wakes the sleepers.
// The daemon releases words naming a slot when that session ends (see
// Session.OnEnd and Slots.Pin).

// Word is one 64-bit state word. Its storage is either its own field (the
// default) or, once Bind is called, a word elsewhere (a shared mapping).
type Word struct {
	p atomic.Pointer[uint64]
	v uint64
}

func (w *Word) ptr() *uint64 {
	if p := w.p.Load(); p != nil {
		return p
	}
	return &w.v
}

// Bind makes w use the word at p from now on, copying its current value
// there. Call it under the object's mutex, before clients can see p.
func (w *Word) Bind(p *uint64) {
	atomic.StoreUint64(p, w.Load())
	w.p.Store(p)
}

// Unbind copies the shared word back into w's own field and stops using
// it, so that the shared word can be given to another object. Call it under
// the object's mutex, after clients have been sent to the daemon.
func (w *Word) Unbind() {
	if p := w.p.Load(); p != nil {
		atomic.StoreUint64(&w.v, atomic.LoadUint64(p))
		w.p.Store(nil)
	}
}

// Bound reports whether w lives in shared memory.
func (w *Word) Bound() bool { return w.p.Load() != nil }

// Load reads the word.
func (w *Word) Load() uint64 { return atomic.LoadUint64(w.ptr()) }

// Store writes the word.
func (w *Word) Store(v uint64) { atomic.StoreUint64(w.ptr(), v) }

// CompareAndSwap replaces old by new, reporting whether it did.
func (w *Word) CompareAndSwap(old, new uint64) bool {
	return atomic.CompareAndSwapUint64(w.ptr(), old, new)
}

// update applies f to the word with a CAS loop; under the object's mutex the
// loop only retries when a fast-path client changed the word meanwhile. It
// returns the old and the new word.
func (w *Word) update(f func(uint64) uint64) (old, n uint64) {
	for {
		old = w.Load()
		n = f(old)
		if w.CompareAndSwap(old, n) {
			return old, n
		}
	}
}

// wakeIf wakes the futex sleepers on a shared word when old had the
// sleepers bit and n has not (the update that cleared it owes the wake).
func (w *Word) wakeIf(old, n uint64) {
	if old&sleepersBit != 0 && n&sleepersBit == 0 {
		if p := w.p.Load(); p != nil {
			statemem.WakeAll(p)
		}
	}
}

// Bit layout shared by the words above.
const (
	slotMask    = statemem.MaskLow
	sleepersBit = statemem.BitWaiters
	waitersBit  = statemem.BitDaemon // the daemon has waiters parked
	depthShift  = statemem.DepthShift
	eventFlag   = statemem.EventFlag
	eventGenOne = statemem.EventGenOne
	eventGenMax = statemem.EventGenMax
	latchShift  = statemem.LatchShift
	latchMask   = statemem.MaskLatch
	daemonLatch = Slot(statemem.LatchDaemon)
)

// setWaiters sets or clears the daemon-waiters bit with a CAS loop. Clearing
// it also clears the sleepers bit and wakes the sleepers: they were waiting
// for the daemon to let go of the word.
func (w *Word) setWaiters(on bool) {
	if on {
		w.update(func(x uint64) uint64 { return x | waitersBit })
		return
	}
	w.wakeIf(w.update(func(x uint64) uint64 { return x &^ (waitersBit | sleepersBit) }))
}

// heldSince says since when the lock whose owner is slot has been held: as
// the daemon recorded it when holder (the session it granted the lock to)
// is that owner, else from the stamp a fast-path owner wrote when it took
// the word. ok is false when neither is known.
func heldSince(holder *Session, slot Slot, h holder, since *Word) (time.Time, bool) {
	if slot == 0 {
		return time.Time{}, false
	}
	if holder != nil && holder.Slot() == slot {
		if t, ok := holder.heldSince(h); ok {
			return t, true
		}
	}
	if !since.Bound() {
		return time.Time{}, false
	}
	return statemem.SinceTime(since.Load())
}

// LockState is a Lock's state: the owner's slot and thread.
type LockState struct {
	W0    Word // owner slot | waiters
	TID   Word // owner thread (informational)
	Since Word // when a fast-path owner took it (statemem.Stamp); see heldSince
}

// Owner returns the holder's slot (0 when unlocked).
func (s *LockState) Owner() Slot { return Slot(s.W0.Load() & slotMask) }

// TryTake sets the owner when the lock is free; it reports whether it did.
func (s *LockState) TryTake(slot Slot, tid int64) bool {
	for { // a CAS fails only when a client changed the word meanwhile: look again
		old := s.W0.Load()
		if old&slotMask != 0 {
			return false
		}
		if s.W0.CompareAndSwap(old, old|uint64(slot)) {
			s.TID.Store(uint64(tid))
			return true
		}
	}
}

// Transfer makes (slot, tid) the owner of a held lock, handing it from
// the holder to a waiter without the word ever reading free.
func (s *LockState) Transfer(slot Slot, tid int64) {
	s.TID.Store(0)
	s.W0.update(func(x uint64) uint64 { return x&^slotMask | uint64(slot) })
	s.TID.Store(uint64(tid))
}

// Free clears the owner, keeping the waiters bit.
// Sleepers on the word are woken.
func (s *LockState) Free() {
	s.TID.Store(0)
	s.W0.wakeIf(s.W0.update(func(x uint64) uint64 { return x &^ (slotMask | sleepersBit) }))
}

// RLockState is an RLock's state: owner slot and thread, and the depth.
type RLockState struct {
	W0    Word // owner slot | waiters | depth
	TID   Word // owner thread
	Since Word // when a fast-path owner took it (outermost acquire)
}

// Owner returns the owner's slot and thread and the recursion depth.
func (s *RLockState) Owner() (slot Slot, tid int64, depth int64) {
	x := s.W0.Load()
	return Slot(x & slotMask), int64(s.TID.Load()), int64(x >> depthShift)
}

// TryTake makes (slot, tid) the owner at depth 1 if the lock is free, by
// compare-and-swap, and reports whether it did.
func (s *RLockState) TryTake(slot Slot, tid int64) bool {
	for {
		old := s.W0.Load()
		if old&slotMask != 0 {
			return false
		}
		if s.W0.CompareAndSwap(old, old&(waitersBit|sleepersBit)|uint64(slot)|1<<depthShift) {
			s.TID.Store(uint64(tid))
			return true
		}
	}
}

// Set makes (slot, tid) the owner at depth; depth 0 frees the lock and
// wakes its sleepers. The thread id is cleared while the owner changes, so
// that a thread of the new owner's process never reads its own id beside
// the slot before it is the owner.
func (s *RLockState) Set(slot Slot, tid int64, depth int64) {
	if depth == 0 {
		s.TID.Store(0)
		s.W0.wakeIf(s.W0.update(func(x uint64) uint64 { return x & waitersBit }))
		return
	}
	if cur := s.W0.Load(); Slot(cur&slotMask) != slot || int64(s.TID.Load()) != tid {
		s.TID.Store(0)
	}
	s.W0.update(func(x uint64) uint64 {
		return x&(waitersBit|sleepersBit) | uint64(slot) | uint64(depth)<<depthShift
	})
	s.TID.Store(uint64(tid))
}

// SemState is a Semaphore's state: W0 holds the free units and the latch
// (the slot whose op is in flight, see statemem.SemAcquire); Ledger, once
// the word is in shared memory, counts the units each small session slot
// took by compare-and-swap. Every change to either happens under the latch.
type SemState struct {
	W0     Word
	Ledger []uint32 // per slot id; nil on the socket path only
}

// Free returns the number of free units.
func (s *SemState) Free() int64 { return int64(s.W0.Load() & slotMask) }

// Latched returns the slot holding the latch (0: none).
func (s *SemState) Latched() Slot { return Slot(s.W0.Load() >> latchShift & slotMask) }

// entry returns slot's ledger entry, or nil when it has none.
func (s *SemState) entry(slot Slot) *uint32 {
	if int(slot) >= len(s.Ledger) {
		return nil
	}
	return &s.Ledger[slot]
}

// Taken returns the units slot took by compare-and-swap, as its entry in
// the segment reads (see Semaphore.taken, which clamps it).
func (s *SemState) Taken(slot Slot) int64 {
	if e := s.entry(slot); e != nil {
		return int64(atomic.LoadUint32(e))
	}
	return 0
}

// setTaken writes slot's ledger entry; the caller holds the latch.
func (s *SemState) setTaken(slot Slot, n int64) {
	if e := s.entry(slot); e != nil {
		atomic.StoreUint32(e, uint32(n))
	}
}

// Claim takes the latch for the daemon when it is free, or over from a
// holder that is no live attached session: one gone says ended (it died
// between the steps of an op, or was never attached), or the daemon's own
// latch value, which only a stray store can leave behind when the caller
// holds the object's mutex (the daemon holds the latch only under it). It
// reports the word as it was and whether it took the latch.
func (s *SemState) Claim(gone func(Slot) bool) (old uint64, ok bool) {
	x := s.W0.Load()
	p := Slot(x >> latchShift & slotMask)
	if p != 0 && p != daemonLatch && (gone == nil || !gone(p)) {
		return x, false
	}
	return x, s.W0.CompareAndSwap(x, x&^latchMask|uint64(daemonLatch)<<latchShift)
}

// Commit adds delta to the free units and lets the latch go, waking the
// futex sleepers. The units stay within 0 and MaxSemaphore: they never
// spill into the flag or latch bits.
func (s *SemState) Commit(delta int64) {
	s.W0.wakeIf(s.W0.update(func(x uint64) uint64 {
		return x&^(latchMask|sleepersBit|slotMask) | clampUnits(int64(x&slotMask)+delta)
	}))
}

// addFree adds delta to the free units, keeping the latch; the caller
// holds it.
func (s *SemState) addFree(delta int64) {
	if delta == 0 {
		return
	}
	s.W0.update(func(x uint64) uint64 {
		return x&^slotMask | clampUnits(int64(x&slotMask)+delta)
	})
}

func clampUnits(n int64) uint64 { return uint64(min(max(n, 0), int64(slotMask))) }

// EventState is an Event's state: its flag and a generation.
type EventState struct {
	W0 Word // flag | generation | waiters
}

// IsSet reads the flag; it needs no mutex.
func (s *EventState) IsSet() bool { return s.W0.Load()&eventFlag != 0 }

// Set raises the flag and bumps the generation.
func (s *EventState) Set() {
	s.W0.wakeIf(s.W0.update(func(x uint64) uint64 {
		if x&eventFlag != 0 {
			return x // set already: no new generation, nobody asleep
		}
		gen := (x&eventGenMax + eventGenOne) & eventGenMax
		return x&waitersBit | gen | eventFlag
	}))
}

// Clear lowers the flag.
func (s *EventState) Clear() { s.W0.update(func(x uint64) uint64 { return x &^ eventFlag }) }

// ValueCell holds a numeric Value's 8 bytes behind a sequence number, so a
// reader in another process can read without writing (a seqlock).
type ValueCell struct {
	Seq  Word // odd while a write is in progress
	Bits Word
}

// Write stores bits; writers are serialised by the Value's mutex.
func (c *ValueCell) Write(bits uint64) (seq uint64) {
	s := c.Seq.Load()
	c.Seq.Store(s + 1)
	c.Bits.Store(bits)
	c.Seq.Store(s + 2)
	return s + 2
}

// Read returns the bits and the sequence number they were read at.
func (c *ValueCell) Read() (bits, seq uint64) {
	for {
		s := c.Seq.Load()
		if s&1 != 0 {
			continue
		}
		b := c.Bits.Load()
		if c.Seq.Load() == s {
			return b, s
		}
	}
}

// toBits encodes a canonical numeric value of class cls for a ValueCell.
func toBits(cls byte, x any) uint64 {
	switch cls {
	case 'i':
		return uint64(x.(int64))
	case 'u':
		return x.(uint64)
	case 'f':
		return math.Float64bits(x.(float64))
	default: // '?'
		if x.(bool) {
			return 1
		}
		return 0
	}
}

// fromBits decodes what toBits encoded.
func fromBits(cls byte, b uint64) any {
	switch cls {
	case 'i':
		return int64(b)
	case 'u':
		return b
	case 'f':
		return math.Float64frombits(b)
	default:
		return b != 0
	}
}
