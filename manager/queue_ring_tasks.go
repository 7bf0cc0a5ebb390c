package manager

import (
	"context"
	"fmt"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// A JoinableQueue with a ring keeps its counts in the ring, where fast-path
// clients change them by themselves: unfinished is the ring's put count
// less its done word, and the debts are the ring's owed table, one entry
// per session slot below statemem.RingSlots (entry 0: the sessions beyond,
// whose shares the daemon keeps in q.owed). The daemon's ops change them
// under q.mu and the latch; a client's under the latch, with a journal the
// daemon finishes when the client dies mid-op (statemem.Ring.repair).

// owedIndex is s's entry in a ring's owed table (0: shared by the sessions
// whose slot is beyond the table).
func owedIndex(s *Session) uint32 {
	if slot := s.Slot(); slot > 0 && slot < statemem.RingSlots {
		return uint32(slot)
	}
	return 0
}

// ringOwe adds d (+1: a get, -1: its undo) to s's debt in the ring (under
// q.mu; q.owed[s] is known).
func (q *Queue) ringOwe(s *Session, d int64) {
	qr := q.ring
	if !qr.r.Lock(qr.gone) {
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

// ringUnfinished is the ring's unfinished count (under q.mu).
func (q *Queue) ringUnfinished() int64 {
	qr := q.ring
	if q.dead != nil || !qr.r.Lock(qr.gone) {
		return 0
	}
	defer qr.r.Unlock(false)
	return int64(qr.r.Unfinished())
}

// ringTaskDone is task_done on a ring (under q.mu): the caller's own debt
// is paid first, then any other's (an item got by one process and finished
// by another), and the done word goes up by one.
func (q *Queue) ringTaskDone(s *Session) error {
	if q.dead != nil {
		return q.dead
	}
	qr := q.ring
	if !qr.r.Lock(qr.gone) {
		return ErrDeleted
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

// ringReleaseOwed marks done what owed-table entry idx owes (a session
// ended): all of it for a slot's entry, s's share of entry 0. Its items are
// not delivered again.
func (q *Queue) ringReleaseOwed(idx uint32, s *Session) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s != nil {
		defer delete(q.owed, s)
	}
	qr := q.ring
	if q.dead != nil || !qr.r.Lock(qr.gone) {
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

// ringJoin is Join on a ring: it waits on the ring's seq until the
// unfinished count is 0 (timeout < 0: for ever).
func (q *Queue) ringJoin(ctx context.Context, timeout time.Duration) (bool, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		q.mu.Lock()
		if q.dead != nil {
			q.mu.Unlock()
			return false, q.dead
		}
		qr := q.ring
		seen := qr.r.Seq()
		n := q.ringUnfinished()
		q.mu.Unlock()
		if n == 0 {
			return true, nil
		}
		if timeout == 0 {
			return false, nil
		}
		if err := qr.wait(ctx, seen, deadline, nil); err != nil {
			if err == errTimeout {
				return false, nil
			}
			return false, err
		}
	}
}
