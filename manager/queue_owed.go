package manager

// A JoinableQueue counts, per session, the items it got and has not marked
// done (owed). When a session ends, the items it still owes are marked done
// for it: a consumer that dies with unfinished items never leaves join()
// waiting for ever (its items are not delivered again: no item is delivered
// twice). task_done by a session that owes nothing (an item got by one
// process and finished by another) pays off another session's debt, so the
// debts never add up to more than the unfinished count.
//
// A JoinableQueue with a ring keeps its counts there (queue_ring_tasks.go).

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
