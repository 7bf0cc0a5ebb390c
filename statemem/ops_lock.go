package statemem

import (
	"sync/atomic"
	"time"
)

// Lock and RLock ops on a state word (the client side of the protocol:
// docs/protocol.md section 11; the C extension's are in
// pyclient/csrc/fp_lock.c).

// LockAcquire takes the Lock whose state word is w (in a segment's object
// slot: its heir field is beside it) for slot, recording tid in aux.
// timeout 0 does not wait; Forever waits without limit. The wait is
// unrecorded: see LockAcquireWait.
func LockAcquire(w, aux *uint64, slot uint32, tid int64, timeout time.Duration) Result {
	var wt Wait
	r := LockAcquireWait(w, aux, slot, tid, timeout, &wt)
	wt.Done(w, r)
	return r
}

// LockAcquireWait is LockAcquire for one slice of a wait whose state wt
// carries over (the caller calls wt.Done when the wait is over). A free
// lock goes to the first taker unless a starving waiter is the heir (see
// waiters.go); a release wakes one sleeper, and whoever takes the lock
// after sleeping keeps BitWaiters set so that its release wakes the next.
func LockAcquireWait(w, aux *uint64, slot uint32, tid int64, timeout time.Duration, wt *Wait) Result {
	deadline := deadlineOf(timeout)
	for {
		x := atomic.LoadUint64(w)
		if x&BitDaemon != 0 {
			return Daemon
		}
		if x&MaskLow == 0 {
			if h := atomic.LoadUint32(heirOf(w)); mayTake(h, slot) {
				n := x | uint64(slot)
				if wt.slept {
					n |= BitWaiters
				}
				if atomic.CompareAndSwapUint64(w, x, n) {
					heirServed(w, h, wt)
					atomic.StoreUint64(aux, uint64(tid))
					return OK
				}
				continue
			}
		}
		if !heirTurn(w, x, timeout, deadline, wt, x&MaskLow == 0) {
			return Busy
		}
	}
}

// LockRelease frees the Lock whose state word is w; any session may release
// it (as threading.Lock). A release that clears BitWaiters wakes one
// sleeper (the heir's, while there is an heir).
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
				releaseWake(w)
			}
			return OK
		}
		atomic.CompareAndSwapUint64(aux, 0, tid)
	}
}

// RLockAcquire takes (or nests) the RLock at w for the pair (slot, tid). The
// owner's thread id lives in aux: the owner writes it right after taking the
// word and clears it right before freeing it, so a thread that reads its own
// id there is the owner. The wait is unrecorded: see RLockAcquireWait.
func RLockAcquire(w, aux *uint64, slot uint32, tid int64, timeout time.Duration) Result {
	var wt Wait
	r := RLockAcquireWait(w, aux, slot, tid, timeout, &wt)
	wt.Done(w, r)
	return r
}

// RLockAcquireWait is RLockAcquire for one slice of a wait (as LockAcquireWait).
func RLockAcquireWait(w, aux *uint64, slot uint32, tid int64, timeout time.Duration, wt *Wait) Result {
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
			if h := atomic.LoadUint32(heirOf(w)); mayTake(h, slot) {
				n := x&BitWaiters | uint64(slot) | DepthOne
				if wt.slept {
					n |= BitWaiters
				}
				if atomic.CompareAndSwapUint64(w, x, n) {
					heirServed(w, h, wt)
					atomic.StoreUint64(aux, uint64(tid))
					return OK
				}
				continue
			}
		}
		if !heirTurn(w, x, timeout, deadline, wt, owner == 0) {
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
				releaseWake(w)
			}
			return OK
		}
		atomic.StoreUint64(aux, uint64(tid)) // still the owner: put it back
	}
}
