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
