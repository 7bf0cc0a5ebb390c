package manager

import (
	"context"
	"fmt"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// A JoinableQueue counts, per session, the items it got and has not marked
// done (owed). When a session ends, the items it still owes are marked done
// for it: a consumer that dies with unfinished items never leaves join()
// waiting for ever (its items are not delivered again: no item is delivered
// twice). task_done by a session that owes nothing (an item got by one
// process and finished by another) pays off another session's debt, so the
// debts never add up to more than the unfinished count.
//
// A JoinableQueue with a ring keeps its counts in the ring, where fast-path
// clients change them by themselves: unfinished is the ring's put count
// less its done word, and the debts are the ring's owed table, one entry
// per session slot below statemem.RingSlots (entry 0: the sessions beyond,
// whose shares the daemon keeps in q.owed). The daemon's ops change them
// under q.mu and the latch; a client's under the latch, with a journal the
// daemon finishes when the client dies mid-op (statemem.Ring.repair).

// Owe records that s got g's item (or items) from a JoinableQueue (nothing for a
// Queue, a failed get or no session). Undoing g takes the debt back.
func (q *Queue) Owe(g *Grant, s *Session) {
	if !q.joinable || !g.ok || s == nil || g.obj == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead != nil {
		return
	}
	if q.owed == nil {
		q.owed = make(map[*Session]int64)
	}
	if _, known := q.owed[s]; !known {
		if !s.OnEnd(func() { q.dropSession(s) }) {
			return // the session already ended: its debt is void
		}
		q.owed[s] = 0
	}
	n := int64(1)
	if g.items != nil {
		n = int64(len(g.items))
	}
	if q.ring != nil {
		q.ringOwe(s, n)
	} else {
		q.owed[s] += n
	}
	g.sess = s
}

// unowe takes back one debt of s (an undone get); called under q.mu.
func (q *Queue) unowe(s *Session) {
	if q.ring != nil {
		if s != nil && q.dead == nil {
			q.ringOwe(s, -1)
		}
		return
	}
	if s != nil && q.owed[s] > 0 {
		q.owed[s]--
	}
}

// payDebt marks one item of s (or, when s owes nothing, of any session)
// done; called under q.mu by task_done.
func (q *Queue) payDebt(s *Session) {
	if q.owed[s] > 0 {
		q.owed[s]--
		return
	}
	for o, n := range q.owed {
		if n > 0 {
			q.owed[o]--
			return
		}
	}
}

// dropSession marks done the items s still owes (its session ended).
func (q *Queue) dropSession(s *Session) {
	if q.ring != nil {
		q.ringReleaseOwed(owedIndex(s), s)
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	n := q.owed[s]
	delete(q.owed, s)
	if n <= 0 || q.dead != nil {
		return
	}
	if n > q.unfinished {
		n = q.unfinished
	}
	q.unfinished -= n
	q.abandoned += n
	if q.unfinished == 0 {
		for w := q.joiners.front(); w != nil; w = q.joiners.front() {
			q.joiners.grant(w)
		}
	}
}

// TaskDoneBy is TaskDone by session s (nil: unknown), which pays off s's
// debt first.
func (q *Queue) TaskDoneBy(s *Session) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.taskDoneLocked(s)
}

// UngetBy is Unget of an item s got (its debt is taken back).
func (q *Queue) UngetBy(item []byte, s *Session) error {
	if err := q.Unget(item); err != nil {
		return err
	}
	q.mu.Lock()
	q.unowe(s)
	q.mu.Unlock()
	return nil
}

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
