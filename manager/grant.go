package manager

// Grant is the effect of a blocking or consuming op that the object has
// already made (a lock taken, a unit or an item handed over) but the caller
// has not yet delivered to its client. The transport either commits it, once
// the reply is written, or undoes it, when the reply could not be written,
// the request was cancelled or the client is gone. Undo restores the state
// the client was told about: an error answer (or no answer) means no effect.
//
// A Grant is a small value: returning one allocates nothing. The zero Grant
// is "nothing granted" (a try that failed, a timeout) and both Commit and
// Undo are no-ops on it. Commit or Undo at most once; a copy must not be
// undone twice.
//
// What each op grants and what undoing it does:
//
//	Lock, RLock, Condition acquire  the lock (one level of an RLock)  release it
//	Semaphore, BoundedSemaphore     one unit                          give it back (bypasses the bound)
//	Queue, JoinableQueue get        the first item                    put it back at the front
//	Condition wait                  notified, lock taken again        pass the notification on, release the lock
//	                                                                  (a failed wait leaves the lock released)
//	Barrier wait, last party        the duty to run the action        break the barrier
//	Queue put, Barrier wait,        nothing to undo: the effect is public at once (another client may
//	Event wait, Join                already have taken the item or passed the barrier); Undo is a no-op
type Grant struct {
	obj    undoer // nil: nothing to undo
	sess   *Session
	tid    int64
	item   []byte
	items  [][]byte // a Queue get_many's items, in order
	index  int64
	ok     bool
	action bool
}

// undoer is an object that can take a grant back.
type undoer interface {
	undo(g *Grant)
}

// OK reports whether the op took effect: the lock was acquired, the wait was
// notified (Condition) or the flag was set (Event), the item was got or put.
func (g Grant) OK() bool { return g.ok }

// Item returns the item a Queue get took.
func (g Grant) Item() []byte { return g.item }

// Items returns the items a Queue get_many took, in order.
func (g Grant) Items() [][]byte { return g.items }

// Index returns a Barrier party's index.
func (g Grant) Index() int64 { return g.index }

// RunAction reports whether a Barrier party is the last one and must run
// the action, then call ActionDone.
func (g Grant) RunAction() bool { return g.action }

// Commit records that the result reached the client; g can no longer be
// undone.
func (g *Grant) Commit() { g.obj = nil }

// Undo gives back what g granted.
func (g *Grant) Undo() {
	if o := g.obj; o != nil {
		g.obj = nil
		o.undo(g)
	}
}
