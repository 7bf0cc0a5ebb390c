package statemem

import (
	"math"
	"sync/atomic"
	"time"
)

// Event ops on a state word and numeric Value ops on an aux word (the C
// extension's are in pyclient/csrc/fp_event_value.c).

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
	var wt Wait
	return EventWaitSinceWait(w, gen, timeout, &wt)
}

// EventWaitSinceWait is EventWaitSince for one slice of a wait whose state
// wt carries over (counted in its waiter record while it sleeps; the
// caller calls wt.Done(w, OK) when the wait is over: a set wakes every
// sleeper, so nothing is passed on).
func EventWaitSinceWait(w *uint64, gen uint64, timeout time.Duration, wt *Wait) bool {
	deadline := deadlineOf(timeout)
	x := atomic.LoadUint64(w)
	for {
		if x&EventFlag != 0 || x&EventGenMax != gen {
			return true
		}
		if timeout == 0 {
			return false
		}
		wt.enter(w)
		if !sleepBits(w, x, deadline, wakeNormal, wt) {
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
