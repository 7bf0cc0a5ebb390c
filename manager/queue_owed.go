package manager

// A JoinableQueue counts, per session, the items it got and has not marked
// done (owed). When a session ends, the items it still owes are marked done
// for it: a consumer that dies with unfinished items never leaves join()
// waiting for ever (its items are not delivered again: no item is delivered
// twice). task_done by a session that owes nothing (an item got by one
// process and finished by another) pays off another session's debt, so the
// debts never add up to more than the unfinished count.
//
// The counts are the store's (queueStore): a listStore keeps them in the
// daemon (queue_store_list.go), a ringStore in its ring, where fast-path
// clients change them too (queue_ring_tasks.go).

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
	q.store.owe(s, n)
	g.sess = s
}

// unowe takes back one debt of s (an undone get); called under q.mu.
func (q *Queue) unowe(s *Session) {
	if s != nil {
		q.store.owe(s, -1)
	}
}

// dropSession marks done the items s still owes (its session ended).
func (q *Queue) dropSession(s *Session) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.store.release(s)
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
