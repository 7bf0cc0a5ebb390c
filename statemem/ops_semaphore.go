package statemem

import (
	"sync/atomic"
	"time"
)

// Semaphore ops on a state word and its ledger (the C extension's are in
// pyclient/csrc/fp_semaphore.c).

// A Semaphore's units, and the ledger entries that say which session holds
// how many, change only while the changer holds the semaphore's latch (the
// word's bits 32-60). A fast-path op is three steps:
//
//  1. claim: CAS the word from "latch free" to "latch = my slot", checking
//     that a unit is free (acquire) or that the caller's ledger entry is
//     positive (release; a release of units the caller does not hold goes
//     to the daemon, which decides whose count it comes off);
//  2. write the caller's ledger entry (one more or one fewer unit);
//  3. commit: CAS the free units (one fewer or one more) and the free latch
//     in together, waking sleepers.
//
// So at every moment the latch is free, free units plus every session's
// ledger entry plus the daemon's own grants add up to the total the daemon
// keeps. When a session dies holding the latch (killed between steps), the
// daemon takes the latch over and recounts the dead session's entry from
// that total; which step it died at does not matter. Everyone waits the few
// nanoseconds a live holder keeps the latch, and at most LatchGrace: a
// latch held longer (a stopped holder, a stray store) sends the op to the
// daemon, which honours the op's deadline.

// latched is the slot holding x's latch (0: none).
func latched(x uint64) uint32 { return uint32(x >> LatchShift & MaskLow) }

// latchSpin is how many times a latch wait reads the word before it sleeps.
const latchSpin = 100

// LatchGrace is how long a client op waits for a latch held by another
// process before it sends the op to the daemon instead; LatchGraceNow is
// that wait for a non-blocking acquire, which must answer at once. A live
// holder lets go within nanoseconds when it runs, but where processes
// outnumber CPUs one preempted inside its op is off the CPU for
// milliseconds, and an acquire sent to the daemon that finds no unit free
// queues there and sets BitDaemon, which sends every process's ops to the
// socket for as long as anyone is queued. A holder that is stopped, or a
// latch no live session holds (a stray store), is the daemon's to judge: it
// takes over a latch naming no live session at once, and waits for a live
// holder only as long as the request's deadline allows.
const (
	LatchGrace    = 50 * time.Millisecond
	LatchGraceNow = 2 * time.Millisecond
)

// waitLatch waits for the latch seen in x to be let go: a few reads, then a
// futex sleep of at most a millisecond. It reports false once the op has
// waited grace in all since *since (set on the first call): the op then
// goes to the daemon.
func waitLatch(w *uint64, x uint64, since *time.Time, grace time.Duration) bool {
	for i := 0; i < latchSpin; i++ {
		if atomic.LoadUint64(w) != x {
			return true
		}
	}
	now := time.Now()
	if since.IsZero() {
		*since = now
	} else if now.Sub(*since) >= grace {
		return false
	}
	sleep(w, x, now.Add(time.Millisecond))
	return true
}

// semWake is the wake-up a commit owes when the word has sleepers and units
// are free (the C extension's sem_wake): one sleeper (the heir's threads
// while there is an heir), not all of them, so that hundreds of waiters do
// not stampede for one unit. BitWaiters stays set while anyone may still
// sleep, so the next commit that frees a unit wakes the next one; a taker
// that leaves units free wakes another, and a woken waiter that leaves
// without a unit passes its wake-up on (Wait.Done). When the wake-up finds
// nobody asleep the bit is cleared, by CAS on the word just committed: a
// waiter about to sleep then sees the word change and looks again.
func semWake(w *uint64, committed uint64) {
	woke := 0
	if atomic.LoadUint32(heirOf(w)) != 0 {
		woke = wakeBits(w, wakeHeir)
	}
	if woke <= 0 {
		woke = WakeOne(w)
	}
	if woke == 0 {
		atomic.CompareAndSwapUint64(w, committed, committed&^BitWaiters)
	}
}

// semCommit ends slot's latch, adding delta to the free units; it reports
// false when the latch is not slot's any more (the daemon took it over: the
// session ended, and the op is void). A commit that leaves units free on a
// word with sleepers wakes one (semWake).
func semCommit(w *uint64, slot uint32, delta int64) bool {
	for {
		x := atomic.LoadUint64(w)
		if latched(x) != slot {
			return false
		}
		n := x&^(MaskLatch|MaskLow) | uint64(int64(x&MaskLow)+delta)
		if atomic.CompareAndSwapUint64(w, x, n) {
			if n&BitWaiters != 0 && n&MaskLow > 0 {
				semWake(w, n)
			}
			return true
		}
	}
}

// SemAcquire takes one unit of the Semaphore whose word is w for slot,
// counting it in e, the slot's ledger entry. Daemon means the op goes to
// the daemon (it has waiters queued, this session ended, or another
// process kept the latch longer than LatchGrace).
func SemAcquire(w *uint64, e *uint32, slot uint32, timeout time.Duration) Result {
	var wt Wait
	r := SemAcquireWait(w, e, slot, timeout, &wt)
	wt.Done(w, r)
	return r
}

// SemAcquireWait is SemAcquire for one slice of a wait whose state wt
// carries over (the caller calls wt.Done when the wait is over). The last
// free unit is kept for a starving waiter's slot (the heir, see
// waiters.go); a commit that leaves units free wakes one sleeper.
func SemAcquireWait(w *uint64, e *uint32, slot uint32, timeout time.Duration, wt *Wait) Result {
	deadline := deadlineOf(timeout)
	grace := LatchGrace // measured over the whole wait (wt.latchSince), across its slices
	if timeout == 0 {
		grace = LatchGraceNow
	}
	for {
		x := atomic.LoadUint64(w)
		h := atomic.LoadUint32(heirOf(w))
		switch {
		case x&BitDaemon != 0:
			return Daemon
		case latched(x) != 0:
			if !waitLatch(w, x, &wt.latchSince, grace) {
				return Daemon
			}
		case x&MaskLow == 1 && h != 0 && h != slot:
			if !heirTurn(w, x, timeout, deadline, wt, true) {
				return Busy
			}
		case x&MaskLow > 0:
			if atomic.CompareAndSwapUint64(w, x, x|uint64(slot)<<LatchShift) {
				atomic.StoreUint32(e, atomic.LoadUint32(e)+1)
				if !semCommit(w, slot, -1) {
					return Daemon
				}
				if h == slot {
					heirServed(w, h, wt)
				}
				return OK
			}
		default:
			if !heirTurn(w, x, timeout, deadline, wt, false) {
				return Busy
			}
		}
	}
}

// SemRelease gives back one unit slot took by SemAcquire. A slot with no
// units of its own in e, a full word, or a daemon with waiters answers
// Daemon: the daemon releases (and refuses what it must).
func SemRelease(w *uint64, e *uint32, slot uint32) Result {
	var latchSince time.Time
	for {
		x := atomic.LoadUint64(w)
		switch {
		case x&BitDaemon != 0 || atomic.LoadUint32(e) == 0 || x&MaskLow == MaskLow:
			return Daemon
		case latched(x) != 0:
			if !waitLatch(w, x, &latchSince, LatchGrace) {
				return Daemon
			}
		case atomic.CompareAndSwapUint64(w, x, x|uint64(slot)<<LatchShift):
			n := atomic.LoadUint32(e)
			if n == 0 { // the daemon moved our unit meanwhile (a foreign release)
				semCommit(w, slot, 0)
				return Daemon
			}
			atomic.StoreUint32(e, n-1)
			if !semCommit(w, slot, 1) {
				return Daemon
			}
			return OK
		}
	}
}

// SemValue returns a Semaphore's free units.
func SemValue(w *uint64) int64 { return int64(atomic.LoadUint64(w) & MaskLow) }
