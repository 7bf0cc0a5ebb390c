package statemem

import (
	"errors"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// The ring's latch, as the daemon takes it: its ops on a ring run under
// it, it takes over the latch of an op whose session ended (repairing
// that op's journal), and it waits for a live client's latch for LatchWait
// at most.

// ErrLatchHeld: a client whose session lives has held the ring's latch for
// LatchWait; Lock gave up, with nothing done.
var ErrLatchHeld = errors.New("statemem: queue ring's latch held by another client")

// LatchWait bounds how long Lock waits for a latch held by a client whose
// session lives. Ops hold it for moments (the longest copies an item of
// the inline limit), so one held this long is a stopped or misbehaving
// client, and the daemon's op fails instead of waiting on it for good.
const LatchWait = 2 * time.Second

// Latched reports whether anyone (a client, or the daemon) holds the
// latch now; false for a closed ring.
func (r *Ring) Latched() bool {
	if !r.enter() {
		return false
	}
	defer r.exit()
	return atomic.LoadUint64(r.word(ringOffLatch)) != 0
}

// Lock takes the latch for the daemon. A latch held longer than a moment
// by a slot for which gone reports true (its session ended, or the value
// names no session at all) is taken over: every op commits with one store,
// so what the dead op left is consistent. So is one that reads
// LatchDaemon while no daemon goroutine holds it (a client wrote it). A
// latch a live client holds is waited for LatchWait at most
// (ErrLatchHeld); ErrRingClosed: the ring is closed. Every Lock that
// returns nil is followed by one Unlock.
func (r *Ring) Lock(gone func(slot uint32) bool) error {
	if !r.enter() {
		return ErrRingClosed
	}
	w := r.word(ringOffLatch)
	start := time.Now()
	var stray time.Time // since when the latch has read LatchDaemon with no daemon goroutine holding it
	for i := 0; ; i++ {
		x := atomic.LoadUint64(w)
		if x == 0 {
			if r.claim(0) {
				// A journal under a free latch was left by an op whose
				// latch was taken over (its session ended while its
				// process lived on): it committed nothing.
				atomic.StoreUint64(r.word(ringOffJOp), 0)
				return nil
			}
			continue
		}
		if i < 100 {
			runtime.Gosched()
			continue
		}
		waited := time.Since(start)
		switch {
		case x == uint64(LatchDaemon):
			switch {
			case r.daemon.Load() != 0:
				stray = time.Time{}
			case stray.IsZero():
				stray = time.Now()
			case time.Since(stray) > time.Millisecond && r.daemon.CompareAndSwap(0, 1):
				if atomic.LoadUint64(w) == uint64(LatchDaemon) {
					r.repair(x)
					return nil
				}
				r.daemon.Add(-1)
			}
		case waited > time.Millisecond && (x > uint64(MaxSlot) || gone(uint32(x))) && r.claim(x):
			r.repair(x)
			return nil
		}
		if waited > LatchWait {
			r.exit()
			return ErrLatchHeld
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// claim sets the latch from held (0: free; a slot whose op is abandoned)
// to LatchDaemon, and reports whether it did. A daemon goroutine that
// claims is counted in r.daemon from before its compare-and-swap until it
// lets go (release), so a LatchDaemon value with none counted is a
// client's (Lock).
func (r *Ring) claim(held uint64) bool {
	r.daemon.Add(1)
	if atomic.CompareAndSwapUint64(r.word(ringOffLatch), held, uint64(LatchDaemon)) {
		return true
	}
	r.daemon.Add(-1)
	return false
}

// release lets go of a latch the daemon claimed.
func (r *Ring) release() {
	atomic.StoreUint64(r.word(ringOffLatch), 0)
	r.daemon.Add(-1)
}

// Unlock lets go of the daemon's latch; when the op changed the ring it
// bumps seq and wakes the sleepers.
func (r *Ring) Unlock(changed bool) { r.unlock(changed, 0) }

// UnlockQuiet is Unlock for a change whose daemon-side waiters the caller
// wakes itself: it wakes the futex only when a client sleeps on it, not
// when the only sleeper is the daemon's own (Sleep), which then sees the
// change at its next look.
func (r *Ring) UnlockQuiet(changed bool) { r.unlock(changed, uint32(r.own.Load())) }

func (r *Ring) unlock(changed bool, own uint32) {
	if changed {
		atomic.AddUint64(r.word(ringOffSeq), 1)
	}
	r.release()
	if changed && atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.mem[ringOffWaiters]))) > own {
		WakeAll(r.word(ringOffSeq))
	}
	r.exit()
}

// ReleaseLatch lets go of the latch if slot holds it (its session ended)
// and forgets slot's sleepers, waking everyone. It reports whether slot
// held the latch.
func (r *Ring) ReleaseLatch(slot uint32) bool {
	if !r.enter() {
		return false
	}
	defer r.exit()
	held := r.claim(uint64(slot))
	if held {
		r.repair(uint64(slot))
		r.release()
	}
	if slot < RingSlots {
		// Both counts are data: the slot's is taken off the total in one
		// step, never below zero, however large a scribble made either.
		mine := atomic.SwapUint32(r.slotWaiters(slot), 0)
		wp := (*uint32)(unsafe.Pointer(&r.mem[ringOffWaiters]))
		for mine > 0 {
			x := atomic.LoadUint32(wp)
			if atomic.CompareAndSwapUint32(wp, x, x-min(x, mine)) {
				break
			}
		}
	}
	atomic.AddUint64(r.word(ringOffSeq), 1)
	WakeAll(r.word(ringOffSeq))
	return held
}

// repair finishes or drops the journal of dead, whose latch the daemon just
// took over: if dead's op committed (the proof word holds the value the
// commit stores), the owed entry gets its value after the op; otherwise the
// op did nothing. Called with the daemon's latch.
func (r *Ring) repair(dead uint64) {
	op := atomic.LoadUint64(r.word(ringOffJOp))
	if op == 0 {
		return
	}
	atomic.StoreUint64(r.word(ringOffJOp), 0)
	if atomic.LoadUint64(r.word(ringOffJHolder)) != dead {
		return // stale: not the dead holder's
	}
	kind, idx, after := op>>56, uint32(op>>32)&(1<<24-1), uint32(op)
	proof := atomic.LoadUint64(r.word(ringOffJProof))
	var at int
	switch kind {
	case RingJournalGet:
		at = ringOffHead
	case RingJournalDone:
		at = ringOffDone
	default:
		return
	}
	if idx >= RingSlots || atomic.LoadUint64(r.word(at)) != proof {
		return // not committed (or nonsense: the counts stay as they are)
	}
	atomic.StoreUint32(r.owedWord(idx), after)
}
