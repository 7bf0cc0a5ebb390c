package manager

import "github.com/syncmgr/syncmgr/statemem"

// The fast-path family of Semaphores and BoundedSemaphores (see
// fastFamily): the state word (free units and latch) is a slot of the
// segment, with a ledger there of the units each session slot took by
// compare-and-swap.

type semaphoreFamily struct{}

func (semaphoreFamily) kinds() []Kind { return []Kind{KindSemaphore, KindBoundedSemaphore} }

// bind moves a Semaphore's word into the segment and gives it a ledger
// there.
func (fam semaphoreFamily) bind(f *fastPath, obj Object) {
	o := obj.(*Semaphore)
	kind, bound := statemem.KindSemaphore, uint64(0)
	if o.bounded {
		kind, bound = statemem.KindBoundedSemaphore, uint64(o.initial)
	}
	ref, err := f.seg.AllocSemaphore(kind, 0, bound)
	if err != nil {
		return
	}
	o.mu.Lock()
	o.st.W0.Bind(f.seg.State(ref.Off))
	o.st.Ledger = f.seg.LedgerEntries(ref.Off)
	o.gone = f.slotGone
	o.pin = f.slots.Pin
	o.mu.Unlock()
	f.remember(o, fam, ref)
}

// unbind takes a removed Semaphore off the segment. It runs under the
// manager's lock, so it never waits for the latch: when a client op is in
// flight, the slot and the ledger are retired for good (never handed out
// again) instead of freed, so that the op's late writes land nowhere
// anyone reads. The units clients took by CAS are forgotten with the object.
func (semaphoreFamily) unbind(f *fastPath, obj Object) {
	o := obj.(*Semaphore)
	ref, ok := f.forget(o)
	if !ok {
		return
	}
	o.mu.Lock()
	inFlight := o.st.Latched() != 0
	statemem.MarkDaemon(f.seg.State(ref.Off))
	o.st.W0.Unbind()
	o.st.W0.update(func(x uint64) uint64 { return x &^ (latchMask | waitersBit | sleepersBit) })
	o.st.Ledger = nil
	o.gone = nil
	o.pin = nil
	o.mu.Unlock()
	if inFlight {
		f.seg.Retire(ref.Off)
	} else {
		f.seg.Free(ref.Off)
	}
}

// sweep takes over a latch naming no live attached session (claim redoes
// the books) and clears a daemon bit with no daemon waiters queued.
func (semaphoreFamily) sweep(obj Object, _ func(Slot) bool) {
	o := obj.(*Semaphore)
	o.mu.Lock()
	if o.dead == nil {
		if _, ok := o.tryClaim(); ok {
			o.waiters.clearStray()
			o.commit(0)
		}
	}
	o.mu.Unlock()
}

// sessionEnded gives back every unit s holds, its ledger entry's included
// (see Semaphore.releaseSession): every Semaphore is visited, not only
// those whose words name s's slot now.
func (semaphoreFamily) sessionEnded(obj Object, s *Session) {
	obj.(*Semaphore).releaseSession(s)
}

func (semaphoreFamily) waitOp() string { return "acquire" }
