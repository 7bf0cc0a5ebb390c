package statemem

import (
	"sync/atomic"
	"time"
)

// The word ops every family shares: their result, the futex sleeps of their
// waits, and the daemon bit. Each family's ops are in a file of their own,
// as the C extension's are (pyclient/csrc/fp_*.c): ops_lock.go (Lock,
// RLock), ops_semaphore.go (Semaphore, BoundedSemaphore), ops_event_value.go
// (Event, numeric Value).

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

// sleepBits is sleep with a wake bitset, recording in wt that it slept.
func sleepBits(w *uint64, x uint64, deadline time.Time, bits uint32, wt *Wait) bool {
	if x&BitWaiters == 0 {
		if !atomic.CompareAndSwapUint64(w, x, x|BitWaiters) {
			return true // changed: look again
		}
		x |= BitWaiters
	}
	var mono uint64
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return false
		}
		mono = MonoNow() + uint64(d)
	}
	if futexWaitBits(w, uint32(x), mono, bits) {
		wt.slept = true // an EAGAIN took no release's wake-up: nothing to keep or pass on
	}
	return true
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
