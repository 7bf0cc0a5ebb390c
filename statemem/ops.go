package statemem

import (
	"math"
	"sync/atomic"
	"time"
)

// Result is the outcome of a word op.
type Result int

const (
	// OK: the op took effect.
	OK Result = iota
	// Busy: the lock is held (or no unit is free) and the op did not wait,
	// or its wait timed out.
	Busy
	// Daemon: BitDaemon is set; send the op to the daemon instead. Nothing
	// was changed.
	Daemon
	// NotOwner: a release of a lock that is not held (Lock) or not held by
	// the caller (RLock). Nothing was changed.
	NotOwner
)

func (r Result) String() string {
	switch r {
	case OK:
		return "ok"
	case Busy:
		return "busy"
	case Daemon:
		return "daemon"
	case NotOwner:
		return "not_owner"
	}
	return "result?"
}

// Forever, as a timeout, waits without limit.
const Forever time.Duration = -1

// sleep marks the word as having sleepers and sleeps while it reads x. It
// reports false when the deadline has passed (nothing slept).
func sleep(w *uint64, x uint64, deadline time.Time) bool {
	if x&BitWaiters == 0 {
		if !atomic.CompareAndSwapUint64(w, x, x|BitWaiters) {
			return true // changed: look again
		}
		x |= BitWaiters
	}
	var d time.Duration
	if !deadline.IsZero() {
		if d = time.Until(deadline); d <= 0 {
			return false
		}
	}
	futexWaitWord(w, uint32(x), d)
	return true
}

func deadlineOf(timeout time.Duration) time.Time {
	if timeout <= 0 { // 0: never waits; Forever: no deadline
		return time.Time{}
	}
	return time.Now().Add(timeout)
}

// LockAcquire takes the Lock whose state word is w for slot, recording tid
// in aux. timeout 0 does not wait; Forever waits without limit. A release
// wakes every sleeper and they race for the word, so a sleeper that dies
// (or times out) after being woken never strands the others.
func LockAcquire(w, aux *uint64, slot uint32, tid int64, timeout time.Duration) Result {
	deadline := deadlineOf(timeout)
	for {
		x := atomic.LoadUint64(w)
		if x&BitDaemon != 0 {
			return Daemon
		}
		if x&MaskLow == 0 {
			if atomic.CompareAndSwapUint64(w, x, x|uint64(slot)) {
				atomic.StoreUint64(aux, uint64(tid))
				return OK
			}
			continue
		}
		if timeout == 0 || !sleep(w, x, deadline) {
			return Busy
		}
	}
}

// LockRelease frees the Lock whose state word is w; any session may release
// it (as threading.Lock). A release that clears BitWaiters wakes everyone.
func LockRelease(w, aux *uint64) Result {
	for {
		x := atomic.LoadUint64(w)
		if x&MaskLow == 0 {
			return NotOwner
		}
		if x&BitDaemon != 0 {
			return Daemon
		}
		tid := atomic.LoadUint64(aux)
		atomic.StoreUint64(aux, 0)
		if atomic.CompareAndSwapUint64(w, x, x&^(MaskLow|BitWaiters)) {
			if x&BitWaiters != 0 {
				WakeAll(w)
			}
			return OK
		}
		atomic.CompareAndSwapUint64(aux, 0, tid)
	}
}

// RLockAcquire takes (or nests) the RLock at w for the pair (slot, tid). The
// owner's thread id lives in aux: the owner writes it right after taking the
// word and clears it right before freeing it, so a thread that reads its own
// id there is the owner.
func RLockAcquire(w, aux *uint64, slot uint32, tid int64, timeout time.Duration) Result {
	deadline := deadlineOf(timeout)
	for {
		x := atomic.LoadUint64(w)
		owner := uint32(x & MaskLow)
		if owner == slot && atomic.LoadUint64(aux) == uint64(tid) {
			if x>>DepthShift == 1<<32-1 {
				return Daemon // depth would overflow: let the daemon refuse
			}
			if atomic.CompareAndSwapUint64(w, x, x+DepthOne) {
				return OK
			}
			continue
		}
		if x&BitDaemon != 0 {
			return Daemon
		}
		if owner == 0 {
			if atomic.CompareAndSwapUint64(w, x, x&BitWaiters|uint64(slot)|DepthOne) {
				atomic.StoreUint64(aux, uint64(tid))
				return OK
			}
			continue
		}
		if timeout == 0 || !sleep(w, x, deadline) {
			return Busy
		}
	}
}

// RLockRelease undoes one acquire of the RLock at w by (slot, tid).
func RLockRelease(w, aux *uint64, slot uint32, tid int64) Result {
	for {
		x := atomic.LoadUint64(w)
		if uint32(x&MaskLow) != slot || slot == 0 || atomic.LoadUint64(aux) != uint64(tid) {
			return NotOwner
		}
		if x>>DepthShift > 1 {
			if atomic.CompareAndSwapUint64(w, x, x-DepthOne) {
				return OK
			}
			continue
		}
		if x&BitDaemon != 0 {
			return Daemon
		}
		atomic.StoreUint64(aux, 0)
		if atomic.CompareAndSwapUint64(w, x, 0) {
			if x&BitWaiters != 0 {
				WakeAll(w)
			}
			return OK
		}
		atomic.StoreUint64(aux, uint64(tid)) // still the owner: put it back
	}
}

// EventIsSet reads an Event's flag.
func EventIsSet(w *uint64) bool { return atomic.LoadUint64(w)&EventFlag != 0 }

// EventSet raises the flag, bumps the generation and wakes every sleeper.
// Setting a set Event changes nothing.
func EventSet(w *uint64) Result {
	for {
		x := atomic.LoadUint64(w)
		if x&EventFlag != 0 {
			return OK
		}
		if x&BitDaemon != 0 {
			return Daemon
		}
		gen := (x&EventGenMax + EventGenOne) & EventGenMax
		if atomic.CompareAndSwapUint64(w, x, x&^(BitWaiters|EventGenMax)|gen|EventFlag) {
			if x&BitWaiters != 0 {
				WakeAll(w)
			}
			return OK
		}
	}
}

// EventClear lowers the flag. It never needs the daemon: nobody waits for
// a clear.
func EventClear(w *uint64) {
	for {
		x := atomic.LoadUint64(w)
		if x&EventFlag == 0 || atomic.CompareAndSwapUint64(w, x, x&^EventFlag) {
			return
		}
	}
}

// EventWait waits until the flag is set (or was set and cleared again since
// the call) or the timeout passes, and reports whether it was set.
func EventWait(w *uint64, timeout time.Duration) bool {
	return EventWaitSince(w, EventGen(w), timeout)
}

// EventGen returns the Event's generation, for EventWaitSince.
func EventGen(w *uint64) uint64 { return atomic.LoadUint64(w) & EventGenMax }

// EventWaitSince is EventWait counting any set since generation gen, so a
// caller that waits in several calls misses no set between them.
func EventWaitSince(w *uint64, gen uint64, timeout time.Duration) bool {
	deadline := deadlineOf(timeout)
	x := atomic.LoadUint64(w)
	for {
		if x&EventFlag != 0 || x&EventGenMax != gen {
			return true
		}
		if timeout == 0 || !sleep(w, x, deadline) {
			return false
		}
		x = atomic.LoadUint64(w)
	}
}

// ValueLoad reads a Value's bits.
func ValueLoad(aux *uint64) uint64 { return atomic.LoadUint64(aux) }

// ValueStore writes a Value's bits (already checked and encoded).
func ValueStore(aux *uint64, bits uint64) { atomic.StoreUint64(aux, bits) }

// ValueCAS replaces old bits by new, reporting whether it did.
func ValueCAS(aux *uint64, old, new uint64) bool {
	return atomic.CompareAndSwapUint64(aux, old, new)
}

// Wrap reduces x to an integer of the class and width (bits) in a Value's
// bound field, as C arithmetic does.
func Wrap(class uint8, width uint, x uint64) uint64 {
	if width >= 64 {
		return x
	}
	x &= 1<<width - 1
	if class == ClassSigned && x&(1<<(width-1)) != 0 {
		x |= ^uint64(0) << width
	}
	return x
}

// ValueAddInt adds delta to an integer Value, wrapping at its width, and
// returns the new bits.
func ValueAddInt(aux *uint64, class uint8, width uint, delta int64) uint64 {
	for {
		old := atomic.LoadUint64(aux)
		n := Wrap(class, width, old+uint64(delta))
		if atomic.CompareAndSwapUint64(aux, old, n) {
			return n
		}
	}
}

// ValueAddFloat adds delta to a float Value (rounding to float32 for
// ClassFloat) and returns the new bits.
func ValueAddFloat(aux *uint64, class uint8, delta float64) uint64 {
	for {
		old := atomic.LoadUint64(aux)
		v := math.Float64frombits(old) + delta
		if class == ClassFloat {
			v = float64(float32(v))
		}
		n := math.Float64bits(v)
		if atomic.CompareAndSwapUint64(aux, old, n) {
			return n
		}
	}
}

// MarkDaemon sets BitDaemon on w (the daemon queued a waiter of its own)
// and returns the word as it now reads.
func MarkDaemon(w *uint64) uint64 {
	for {
		x := atomic.LoadUint64(w)
		if x&BitDaemon != 0 || atomic.CompareAndSwapUint64(w, x, x|BitDaemon) {
			return x | BitDaemon
		}
	}
}

// UnmarkDaemon clears BitDaemon (the daemon's queue is empty) and wakes
// the sleepers, which were waiting for the daemon to let go.
func UnmarkDaemon(w *uint64) {
	for {
		x := atomic.LoadUint64(w)
		if x&BitDaemon == 0 {
			return
		}
		if atomic.CompareAndSwapUint64(w, x, x&^(BitDaemon|BitWaiters)) {
			if x&BitWaiters != 0 {
				WakeAll(w)
			}
			return
		}
	}
}
