package manager

import (
	"fmt"

	"github.com/syncmgr/syncmgr/statemem"
)

// A JoinableQueue with a ring keeps its task counts in the ring, where
// fast-path clients change them by themselves: unfinished is the ring's
// put count less its done word, and the debts (queue_owed.go) are the
// ring's owed table, one entry per session slot below statemem.RingSlots
// (entry 0: the sessions beyond, whose shares the daemon keeps in
// q.owed). The daemon's ops change them under q.mu and the latch; a
// client's under the latch, with a journal the daemon finishes when the
// client dies mid-op (statemem.Ring.repair). The daemon's joiners wait on
// the ring's seq, as its getters and putters do.

// owedIndex is s's entry in a ring's owed table (0: shared by the sessions
// whose slot is beyond the table).
func owedIndex(s *Session) uint32 {
	if slot := s.Slot(); slot > 0 && slot < statemem.RingSlots {
		return uint32(slot)
	}
	return 0
}

// owe adds d (+n: a get of n items, -1: its undo) to s's debt in the ring
// (under q.mu; q.owed[s] is known for a get). A failed queue's debts are
// void.
func (qr *ringStore) owe(s *Session, d int64) {
	q := qr.q
	if q.dead != nil || qr.lockWaiting() != nil {
		return
	}
	defer qr.r.Unlock(false)
	idx := owedIndex(s)
	if idx == 0 {
		if d < 0 && q.owed[s] <= 0 {
			return
		}
		q.owed[s] += d
	}
	v := int64(qr.r.Owed(idx)) + d
	if v < 0 {
		v = 0
	}
	qr.r.SetOwed(idx, uint32(v))
}

// unfinished is the ring's unfinished count (under q.mu). With the latch
// held by another client for LatchWait it is the count read without it,
// and the error says so (a join must not take that for done).
func (qr *ringStore) unfinished() (int64, error) {
	if qr.q.dead != nil {
		return 0, nil
	}
	if err := qr.lock(); err != nil {
		return int64(qr.r.UnfinishedNow()), err
	}
	defer qr.r.Unlock(false)
	return int64(qr.r.Unfinished()), nil
}

// taskDone is task_done on a ring (under q.mu): the caller's own debt is
// paid first, then any other's (an item got by one process and finished
// by another), and the done word goes up by one.
func (qr *ringStore) taskDone(s *Session) error {
	q := qr.q
	if q.dead != nil {
		return q.dead
	}
	if err := qr.lock(); err != nil {
		return err
	}
	if qr.r.Unfinished() == 0 {
		qr.r.Unlock(false)
		return fmt.Errorf("%w: task_done() called too many times", ErrValue)
	}
	idx := owedIndex(s)
	switch {
	case s != nil && idx != 0 && qr.r.Owed(idx) > 0:
		qr.r.SetOwed(idx, qr.r.Owed(idx)-1)
	case s != nil && idx == 0 && q.owed[s] > 0 && qr.r.Owed(0) > 0:
		q.owed[s]--
		qr.r.SetOwed(0, qr.r.Owed(0)-1)
	default:
		for i := uint32(0); i < statemem.RingSlots; i++ {
			if n := qr.r.Owed(i); n > 0 {
				qr.r.SetOwed(i, n-1)
				if i == 0 {
					for o, m := range q.owed {
						if m > 0 {
							q.owed[o]--
							break
						}
					}
				}
				break
			}
		}
	}
	qr.r.AddDone(1)
	qr.unlock(true) // wakes the joiners
	return nil
}

// release marks done what s owes (its session ended; under q.mu).
func (qr *ringStore) release(s *Session) { qr.releaseOwed(owedIndex(s), s) }

// releaseOwed marks done what owed-table entry idx owes (a session ended):
// all of it for a slot's entry, s's share of entry 0. Its items are not
// delivered again. Called under q.mu.
func (qr *ringStore) releaseOwed(idx uint32, s *Session) {
	q := qr.q
	if s != nil {
		defer delete(q.owed, s)
	}
	// A session that owes nothing takes no latch (the end of a session
	// that never used this queue does not wait on a client that holds it).
	if q.dead != nil || idx == 0 && (s == nil || q.owed[s] == 0) || idx != 0 && qr.r.OwedNow(idx) == 0 {
		return
	}
	if qr.lockWaiting() != nil {
		return
	}
	n := uint64(qr.r.Owed(idx))
	if idx == 0 {
		share := uint64(0)
		if s != nil && q.owed[s] > 0 {
			share = uint64(q.owed[s])
		}
		n = min(n, share)
	}
	qr.r.SetOwed(idx, uint32(uint64(qr.r.Owed(idx))-n))
	n = min(n, qr.r.Unfinished())
	qr.r.AddDone(int64(n))
	q.abandoned += int64(n)
	qr.unlock(n > 0)
}
