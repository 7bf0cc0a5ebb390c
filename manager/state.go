package manager

import (
	"math"
	"sync/atomic"
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
// Intended shared-memory layout (each word a uint64, 8-byte aligned, native
// byte order, in a daemon-owned segment; a slot id is a session's Slot, 0
// meaning "nobody"):
//
//	Lock             w0: bits 0-31 owner slot (0 = unlocked)
//	                     bit  32   waiters (someone is parked in the daemon)
//	                 w1: owner's thread id (informational; any thread may release)
//	RLock            w0: bits 0-31 owner slot (0 = unlocked)
//	                     bit  32   waiters
//	                     bits 33-63 recursion depth
//	                 w1: owner's thread id (written by the owner after it took
//	                     w0, cleared before it frees w0)
//	Semaphore,       w0: bits 0-31 free units
//	BoundedSemaphore     bit  32   waiters
//	                 (the initial value, the bound, is constant: in the header)
//	Event            w0: bit  0    flag
//	                     bits 1-31 generation, bumped by every set (a futex
//	                               waiter wakes on any change of the word)
//	                     bit  32   waiters
//	Value            w0: sequence number, odd while a writer is in (seqlock)
//	                 w1: the value's 8 bytes: int64, uint64, float64 bits, or
//	                     0/1 for '?'. Typecodes 'c' and 'O' (bytes) have no
//	                     cell and stay in daemon memory.
//
// A fast-path client changes a word with one compare-and-swap when the
// waiters bit is clear; when it is set, or the CAS cannot succeed without
// waiting, it goes through the daemon (which parks waiters and sets the bit).
// The daemon releases words naming a slot when that session ends (see
// Session.OnEnd and Slots.Pin).

// Word is one 64-bit state word. Its storage is either its own field (the
// default) or, once Bind is called, a word elsewhere (a shared mapping).
type Word struct {
	p *uint64
	v uint64
}

func (w *Word) ptr() *uint64 {
	if w.p != nil {
		return w.p
	}
	return &w.v
}

// Bind makes w use the word at p from now on, copying its current value
// there. It must be called before w is shared, under the object's mutex.
func (w *Word) Bind(p *uint64) {
	atomic.StoreUint64(p, w.Load())
	w.p = p
}

// Load reads the word.
func (w *Word) Load() uint64 { return atomic.LoadUint64(w.ptr()) }

// Store writes the word.
func (w *Word) Store(v uint64) { atomic.StoreUint64(w.ptr(), v) }

// CompareAndSwap replaces old by new, reporting whether it did.
func (w *Word) CompareAndSwap(old, new uint64) bool {
	return atomic.CompareAndSwapUint64(w.ptr(), old, new)
}

// update applies f to the word with a CAS loop; under the object's mutex the
// loop only retries when a fast-path client changed the word meanwhile.
func (w *Word) update(f func(uint64) uint64) uint64 {
	for {
		old := w.Load()
		n := f(old)
		if w.CompareAndSwap(old, n) {
			return n
		}
	}
}

// Bit layout shared by the words above.
const (
	slotMask    = 1<<32 - 1
	waitersBit  = 1 << 32
	depthShift  = 33
	eventFlag   = 1
	eventGenOne = 1 << 1
	eventGenMax = (1<<31 - 1) << 1
)

// setWaiters sets or clears the waiters bit with a CAS loop.
func (w *Word) setWaiters(on bool) {
	w.update(func(x uint64) uint64 {
		if on {
			return x | waitersBit
		}
		return x &^ waitersBit
	})
}

// LockState is a Lock's state: the owner's slot and thread.
type LockState struct {
	W0  Word // owner slot | waiters
	TID Word // owner thread (informational)
}

// Owner returns the holder's slot (0 when unlocked).
func (s *LockState) Owner() Slot { return Slot(s.W0.Load() & slotMask) }

// TryTake sets the owner when the lock is free; it reports whether it did.
func (s *LockState) TryTake(slot Slot, tid int64) bool {
	old := s.W0.Load()
	if old&slotMask != 0 {
		return false
	}
	if !s.W0.CompareAndSwap(old, old|uint64(slot)) {
		return false
	}
	s.TID.Store(uint64(tid))
	return true
}

// Transfer makes (slot, tid) the owner of a held lock, handing it from
// the holder to a waiter without the word ever reading free.
func (s *LockState) Transfer(slot Slot, tid int64) {
	s.TID.Store(uint64(tid))
	s.W0.update(func(x uint64) uint64 { return x&^slotMask | uint64(slot) })
}

// Free clears the owner, keeping the waiters bit.
func (s *LockState) Free() {
	s.TID.Store(0)
	s.W0.update(func(x uint64) uint64 { return x &^ slotMask })
}

// RLockState is an RLock's state: owner slot and thread, and the depth.
type RLockState struct {
	W0  Word // owner slot | waiters | depth
	TID Word // owner thread
}

// Owner returns the owner's slot and thread and the recursion depth.
func (s *RLockState) Owner() (slot Slot, tid int64, depth int64) {
	x := s.W0.Load()
	return Slot(x & slotMask), int64(s.TID.Load()), int64(x >> depthShift)
}

// Set makes (slot, tid) the owner at depth; depth 0 frees the lock.
func (s *RLockState) Set(slot Slot, tid int64, depth int64) {
	if depth == 0 {
		s.TID.Store(0)
		s.W0.update(func(x uint64) uint64 { return x & waitersBit })
		return
	}
	s.W0.update(func(x uint64) uint64 {
		return x&waitersBit | uint64(slot) | uint64(depth)<<depthShift
	})
	s.TID.Store(uint64(tid))
}

// SemState is a Semaphore's state: the number of free units.
type SemState struct {
	W0 Word // free units | waiters
}

// Free returns the number of free units.
func (s *SemState) Free() int64 { return int64(s.W0.Load() & slotMask) }

// Add adds d (possibly negative) to the free units.
func (s *SemState) Add(d int64) {
	s.W0.update(func(x uint64) uint64 {
		return x&waitersBit | uint64(int64(x&slotMask)+d)&slotMask
	})
}

// EventState is an Event's state: its flag and a generation.
type EventState struct {
	W0 Word // flag | generation | waiters
}

// IsSet reads the flag; it needs no mutex.
func (s *EventState) IsSet() bool { return s.W0.Load()&eventFlag != 0 }

// Set raises the flag and bumps the generation.
func (s *EventState) Set() {
	s.W0.update(func(x uint64) uint64 {
		gen := (x&eventGenMax + eventGenOne) & eventGenMax
		return x&waitersBit | gen | eventFlag
	})
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
