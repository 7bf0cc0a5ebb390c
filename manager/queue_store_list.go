package manager

import (
	"bytes"
	"container/list"
	"context"
	"fmt"
	"time"
)

// listStore keeps a Queue's items in the daemon, in a list (every Queue
// off the fast path). It changes only under q.mu, and serves the waiters
// as it changes: a put finding getters waiting hands its item to the first
// (the queue is empty), and a get that makes room lets in the waiting
// putters that fit, first come, first served (admit). So a put waits its
// turn behind the putters already waiting, and a waiter waits for nothing
// but its own ready (wait).
type listStore struct {
	q       *Queue
	items   list.List
	bytes   int64
	pending int64 // joinable: items put and not yet marked done
}

// accepted counts a put that succeeded.
func (s *listStore) accepted() {
	if s.q.joinable {
		s.pending++
	}
}

func (s *listStore) pushBack(item []byte) {
	s.items.PushBack(item)
	s.bytes += int64(len(item))
}

func (s *listStore) popFront() []byte {
	e := s.items.Front()
	s.items.Remove(e)
	item := e.Value.([]byte)
	s.bytes -= int64(len(item))
	s.q.uncharge(ItemCost(item))
	return item
}

// roomFor reports whether n more items fit under maxsize.
func (s *listStore) roomFor(n int) bool {
	return s.q.maxsize <= 0 || int64(s.items.Len()+n) <= s.q.maxsize
}

func (s *listStore) tryPut(item []byte) (bool, error) {
	q := s.q
	if q.handToGetter(item) { // the queue is empty: hand it over
		s.accepted()
		return true, nil
	}
	if !s.roomFor(1) || q.putters.len() > 0 {
		return false, nil
	}
	if err := q.charge(ItemCost(item)); err != nil {
		return false, err
	}
	s.pushBack(item)
	s.accepted()
	return true, nil
}

func (s *listStore) tryPutMany(items [][]byte) (bool, error) {
	q := s.q
	if q.putters.len() > 0 || !s.roomFor(len(items)) {
		return false, nil
	}
	// All or nothing: the batch's bytes are charged at once, and what
	// goes straight to waiting getters is given back.
	whole := itemsCost(items)
	if err := q.charge(whole); err != nil {
		return false, err
	}
	for _, it := range items {
		if s.items.Len() == 0 && q.handToGetter(it) { // the head of the FIFO
			q.uncharge(ItemCost(it))
		} else {
			s.pushBack(ownItem(it, whole))
		}
		s.accepted()
	}
	return true, nil
}

func (s *listStore) tryGet() ([]byte, bool, error) {
	if s.items.Len() == 0 {
		return nil, false, nil
	}
	item := s.popFront()
	s.admit()
	return item, true, nil
}

func (s *listStore) tryGetMany(items [][]byte, max int, budget int64) ([][]byte, error) {
	had := len(items)
	for end := len(items) + max; len(items) < end && s.items.Len() > 0; {
		n := int64(len(s.items.Front().Value.([]byte))) + batchItemFraming
		if n > budget {
			break // over the reply's budget: it stays the head
		}
		budget -= n
		items = append(items, s.popFront())
	}
	if len(items) > had {
		s.admit()
	}
	return items, nil
}

func (s *listStore) unget(item []byte) {
	q := s.q
	if q.handToGetter(item) {
		return
	}
	item = bytes.Clone(item) // (a view of a request's frame, whose size is not known here: a rare path)
	s.items.PushFront(item)
	s.bytes += int64(len(item))
	q.held += ItemCost(item)
	q.lim.force(ItemCost(item)) // an undo must not fail on a limit
}

func (s *listStore) charge(n int64) error { return s.q.charge(n) }

// admit moves the waiting putters' items into the queue, first come first
// served, while the first one's fit (a put_many's all together); their
// bytes were charged when they began to wait.
func (s *listStore) admit() {
	q := s.q
	for w := q.putters.front(); w != nil; w = q.putters.front() {
		if w.items == nil {
			if !s.roomFor(1) {
				return
			}
			s.pushBack(w.item)
			w.item = nil
			s.accepted()
		} else {
			if !s.roomFor(len(w.items)) {
				return
			}
			whole := itemsCost(w.items)
			for _, it := range w.items {
				s.pushBack(ownItem(it, whole))
				s.accepted()
			}
			w.items = nil
		}
		q.putters.grant(w)
	}
}

func (s *listStore) len() int { return s.items.Len() }

func (s *listStore) depth() (items, bytes int64) { return int64(s.items.Len()), s.bytes }

func (s *listStore) describe() (string, int) {
	q := s.q
	return q.describeLine(int64(s.items.Len()), s.bytes, "", s.pending), q.getters.len() + q.putters.len()
}

func (s *listStore) unfinished() (int64, error) { return s.pending, nil }

// taskDone pays off a debt (payDebt) and lets the joiners go once nothing
// is unfinished.
func (s *listStore) taskDone(sess *Session) error {
	if s.pending <= 0 {
		return fmt.Errorf("%w: task_done() called too many times", ErrValue)
	}
	s.payDebt(sess)
	if s.pending--; s.pending == 0 {
		s.q.wakeJoiners()
	}
	return nil
}

// payDebt marks one item of sess (or, when sess owes nothing, of any
// session) done.
func (s *listStore) payDebt(sess *Session) {
	owed := s.q.owed
	if owed[sess] > 0 {
		owed[sess]--
		return
	}
	for o, n := range owed {
		if n > 0 {
			owed[o]--
			return
		}
	}
}

// owe keeps the debts in q.owed (a debt taken back never goes below 0).
func (s *listStore) owe(sess *Session, d int64) {
	q := s.q
	if d < 0 && q.owed[sess] <= 0 {
		return
	}
	q.owed[sess] += d
}

// release marks done what sess owes, up to what is unfinished.
func (s *listStore) release(sess *Session) {
	q := s.q
	n := q.owed[sess]
	delete(q.owed, sess)
	if n <= 0 || q.dead != nil {
		return
	}
	if n > s.pending {
		n = s.pending
	}
	s.pending -= n
	q.abandoned += n
	if s.pending == 0 {
		q.wakeJoiners()
	}
}

// mark is 0: the list changes only as its waiters are served.
func (s *listStore) mark() uint32 { return 0 }

// wait waits for ready alone: the list changes only under q.mu, and what
// a change means for a waiter (an item, room, nothing unfinished) is
// handed to it there.
func (s *listStore) wait(ctx context.Context, _ uint32, deadline time.Time, ready <-chan struct{}) error {
	var tc <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-ready:
		return nil
	case <-tc:
		return errTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}
