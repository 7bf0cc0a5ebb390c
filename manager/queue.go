package manager

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// Queue is a FIFO of opaque items, as queue.Queue. Getters and putters that
// wait are served first come, first served; an item handed to a getter that
// is cancelled goes back to the front.
//
// The Queue's ops (this file, queue_batch.go, queue_owed.go) check the
// queue, wait and account for grants and debts the same way whatever keeps
// the items; a queueStore keeps them (below).
type Queue struct {
	base
	joinable  bool
	maxsize   int64       // <= 0: unbounded
	lim       *byteLimits // nil: no byte limits
	held      int64       // counted bytes of items the daemon keeps and of waiting putters' items
	store     queueStore  // the items: a listStore, or a ringStore on the fast path (bindQueue)
	getters   waitQueue   // each may be handed its item by a put or an undone get (handToGetter)
	putters   waitQueue   // each carries the item (or batch) it wants to put
	joiners   waitQueue
	owed      map[*Session]int64 // joinable: items each session got and has not marked done (queue_owed.go)
	abandoned int64              // joinable: items marked done because their session ended
}

// queueStore keeps a Queue's items and, for a JoinableQueue, its task
// counts. Every method but wait is called under q.mu (the tries and unget
// only while q has not failed), and none of them waits: a try that finds no item or no room reports it,
// and the Queue waits (put, get, Join) until the store changes, a putter's
// or getter's waiter is served, the deadline passes or ctx ends. A store
// says what a change is (mark, wait): a listStore changes only under q.mu,
// serving the waiters itself (it lets putters in, first come, first
// served, and getters are handed items), so it waits for nothing else; a
// ringStore also changes when fast-path clients use its ring, and wakes
// its waiters then (queue_ring_watch.go), who try again.
//
// To keep a Queue's items somewhere new, write a type with these methods
// in a file of its own and swap it in as bindQueue does a ringStore.
type queueStore interface {
	// tryPut stores item, or hands it to a waiting getter (handToGetter)
	// while the queue holds nothing; false: no room now. It charges what
	// the daemon keeps (q.charge and the like) and fails on a limit.
	tryPut(item []byte) (ok bool, err error)
	// tryPutMany stores all of items, adjacent and in order, or none.
	tryPutMany(items [][]byte) (ok bool, err error)
	// tryGet removes the first item; false: none now.
	tryGet() (item []byte, ok bool, err error)
	// tryGetMany removes up to max items now, in order, while their sizes
	// (each with batchItemFraming) fit budget, and appends them to dst: a
	// get_many's items after its first. It does not wait; what it returns
	// is the caller's, also with an error.
	tryGetMany(dst [][]byte, max int, budget int64) ([][]byte, error)
	// unget puts item back at the front (or hands it to a waiting
	// getter), whatever maxsize and the limits say.
	unget(item []byte)
	// charge counts n bytes of a waiting putter's items against the
	// limits (q.held), as the store counts what it keeps.
	charge(n int64) error
	// admit lets in what it can of the waiting putters after one left (a
	// store whose putters try again by themselves lets in none).
	admit()
	len() int
	depth() (items, bytes int64)
	describe() (state string, waiters int)
	// The task counts (queue_owed.go): unfinished, task_done by s, a
	// debt of s changed by d (+n: s got n items; -1: a get undone), and
	// what s owes marked done (s ended).
	unfinished() (int64, error)
	taskDone(s *Session) error
	owe(s *Session, d int64)
	release(s *Session)
	// mark is the store's state for wait (under q.mu, before a try).
	mark() uint32
	// wait returns (without q.mu) when the store may have changed since
	// mark (spurious returns are fine: the caller tries again), when
	// ready closes, at the deadline (errTimeout; zero: none) or when ctx
	// ends.
	wait(ctx context.Context, mark uint32, deadline time.Time, ready <-chan struct{}) error
}

func newQueue(name string, maxsize int64) *Queue {
	q := &Queue{base: base{name: name}, maxsize: maxsize}
	q.store = &listStore{q: q}
	return q
}

// Kind implements Object.
func (q *Queue) Kind() Kind {
	if q.joinable {
		return KindJoinableQueue
	}
	return KindQueue
}

// deadlineOf is when a wait of timeout (< 0: for ever) ends (zero: never).
func deadlineOf(timeout time.Duration) time.Time {
	if timeout > 0 {
		return time.Now().Add(timeout)
	}
	return time.Time{}
}

// TaskDone marks one item got from a JoinableQueue as processed; more calls
// than items put is ErrValue.
func (q *Queue) TaskDone() error { return q.TaskDoneBy(nil) }

func (q *Queue) taskDoneLocked(s *Session) error {
	if !q.joinable {
		return fmt.Errorf("%w: task_done on a queue that is not joinable", ErrType)
	}
	return q.store.taskDone(s)
}

// ownItem is item as a store keeps it. A put's or put_many's items are
// views of their request's frame, and whole is what that frame's items
// cost together (itemsCost of the batch; ItemCost of a put's one item).
// An item kept as a view keeps the whole frame alive while only the item
// is charged, so one is copied unless it is large (SocketKeepMin) and at
// least half of its frame: what a kept item holds in memory is then at
// most twice what it is charged. The stores copy only what they keep: an
// item that goes into a ring is copied there, and one handed to a waiting
// getter is gone with its reply.
func ownItem(item []byte, whole int64) []byte {
	if len(item) < SocketKeepMin || 2*int64(len(item)) < whole {
		return bytes.Clone(item)
	}
	return item
}

// wakeJoiners lets every joiner go (nothing is unfinished); under q.mu.
func (q *Queue) wakeJoiners() {
	for w := q.joiners.front(); w != nil; w = q.joiners.front() {
		q.joiners.grant(w)
	}
}

// Join waits until every item put has been marked done. It reports false
// on timeout.
func (q *Queue) Join(ctx context.Context, timeout time.Duration) (bool, error) {
	deadline := deadlineOf(timeout)
	q.mu.Lock()
	for {
		if q.dead != nil {
			q.mu.Unlock()
			return false, q.dead
		}
		seen := q.store.mark()
		n, err := q.store.unfinished()
		if err != nil {
			q.mu.Unlock()
			return false, err
		}
		if n == 0 {
			q.mu.Unlock()
			return true, nil
		}
		if timeout == 0 {
			q.mu.Unlock()
			return false, nil
		}
		w := newWaiter(nil, 0)
		q.joiners.push(w)
		q.mu.Unlock()
		err = q.store.wait(ctx, seen, deadline, w.ready)
		q.mu.Lock()
		if !q.joiners.remove(w) { // let go (also when that raced with ctx), or failed
			q.mu.Unlock()
			return w.err == nil, w.err
		}
		if err != nil {
			q.mu.Unlock()
			if err == errTimeout {
				return false, nil
			}
			return false, err
		}
	}
}

// Unfinished returns the number of unfinished tasks.
func (q *Queue) Unfinished() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	n, _ := q.store.unfinished() // (a latch held too long: the count read without it)
	return n
}

func (q *Queue) full() bool {
	return q.maxsize > 0 && int64(q.store.len()) >= q.maxsize
}

// charge counts n more bytes held by q (an item stored or a putter's item
// waiting); over a limit it fails and counts nothing. Called under q.mu.
func (q *Queue) charge(n int64) error {
	if err := q.lim.charge(q.held, n); err != nil {
		return err
	}
	q.held += n
	return nil
}

// uncharge gives back n counted bytes; called under q.mu.
func (q *Queue) uncharge(n int64) {
	q.held -= n
	q.lim.release(n)
}

// Put is PutGrant committed at once.
func (q *Queue) Put(ctx context.Context, item []byte, block bool, timeout time.Duration) error {
	_, err := q.PutGrant(ctx, item, block, timeout)
	return err
}

// PutGrant appends item, waiting for room when the queue is full. It fails
// with ErrFull when there is no room in time (or at once with block false).
// A put is public as soon as it is made (a getter may take the item at
// once), so its grant has nothing to undo.
func (q *Queue) PutGrant(ctx context.Context, item []byte, block bool, timeout time.Duration) (Grant, error) {
	if err := q.put(ctx, item, nil, block, timeout); err != nil {
		return Grant{}, err
	}
	return Grant{ok: true}, nil
}

// put puts item (items nil) or all of items (a put_many, all or none),
// waiting for room as block and timeout allow. A waiting putter's items
// are held too: counted while it waits, given back when it leaves, and the
// putters behind it that fit now are let in (a batch that left may have
// held back smaller puts).
func (q *Queue) put(ctx context.Context, item []byte, items [][]byte, block bool, timeout time.Duration) error {
	deadline := deadlineOf(timeout)
	q.mu.Lock()
	for {
		if q.dead != nil {
			q.mu.Unlock()
			return q.dead
		}
		seen := q.store.mark()
		var ok bool
		var err error
		if items == nil {
			ok, err = q.store.tryPut(item)
		} else {
			ok, err = q.store.tryPutMany(items)
		}
		if ok || err != nil {
			q.mu.Unlock()
			return err
		}
		if !block || timeout == 0 {
			q.mu.Unlock()
			return ErrFull
		}
		cost := ItemCost(item)
		if items != nil {
			cost = itemsCost(items)
		}
		if err := q.store.charge(cost); err != nil {
			q.mu.Unlock()
			return err
		}
		w := newWaiter(nil, 0)
		w.item, w.items = item, items
		q.putters.push(w)
		q.mu.Unlock()
		err = q.store.wait(ctx, seen, deadline, w.ready)
		q.mu.Lock()
		if !q.putters.remove(w) { // let in (also when that raced with ctx), or failed
			q.mu.Unlock()
			return w.err
		}
		if q.dead == nil { // a failed queue gave back everything held
			q.uncharge(cost)
			q.store.admit()
		}
		if err != nil {
			q.mu.Unlock()
			if err == errTimeout {
				return ErrFull
			}
			return err
		}
	}
}

// Get is GetGrant committed at once.
func (q *Queue) Get(ctx context.Context, block bool, timeout time.Duration) ([]byte, error) {
	g, err := q.GetGrant(ctx, block, timeout)
	g.Commit()
	return g.Item(), err
}

// GetGrant removes the first item, waiting for one when the queue is
// empty. It fails with ErrEmpty when none comes in time. Undoing the grant
// puts the item back at the front (or straight to a waiting getter).
func (q *Queue) GetGrant(ctx context.Context, block bool, timeout time.Duration) (Grant, error) {
	item, err := q.get(ctx, block, timeout)
	if err != nil {
		return Grant{}, err
	}
	return Grant{obj: q, item: item, ok: true}, nil
}

func (q *Queue) undo(g *Grant) {
	if g.items == nil {
		_ = q.UngetBy(g.item, g.sess)
		return
	}
	for i := len(g.items) - 1; i >= 0; i-- { // each goes to the front: the last first
		_ = q.UngetBy(g.items[i], g.sess)
	}
}

func (q *Queue) get(ctx context.Context, block bool, timeout time.Duration) ([]byte, error) {
	deadline := deadlineOf(timeout)
	q.mu.Lock()
	for {
		if q.dead != nil {
			q.mu.Unlock()
			return nil, q.dead
		}
		seen := q.store.mark()
		item, ok, err := q.store.tryGet()
		if ok || err != nil {
			q.mu.Unlock()
			return item, err
		}
		if !block || timeout == 0 {
			q.mu.Unlock()
			return nil, ErrEmpty
		}
		w := newWaiter(nil, 0)
		q.getters.push(w)
		q.mu.Unlock()
		err = q.store.wait(ctx, seen, deadline, w.ready)
		q.mu.Lock()
		if !q.getters.remove(w) { // handed an item (also when that raced with ctx: the caller owns it), or failed
			q.mu.Unlock()
			return w.item, w.err
		}
		if err != nil {
			q.mu.Unlock()
			if err == errTimeout {
				return nil, ErrEmpty
			}
			return nil, err
		}
	}
}

// handToGetter gives item to the first waiting getter, if any, and
// reports whether it did (under q.mu). A store calls it only while the
// queue holds nothing, or for an item going back to the front: the item
// is the head of the FIFO.
func (q *Queue) handToGetter(item []byte) bool {
	w := q.getters.front()
	if w == nil {
		return false
	}
	w.item = item
	q.getters.grant(w)
	return true
}

// Unget puts an item back at the front, ignoring maxsize. It is the undo
// of a get (see GetGrant), and an op of its own for clients that undo a get
// whose reply raced with their cancellation.
func (q *Queue) Unget(item []byte) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead != nil {
		return q.dead
	}
	q.store.unget(item)
	return nil
}

// Len returns the number of items.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.store.len()
}

// Full reports whether the queue is at its maxsize.
func (q *Queue) Full() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.full()
}

// Depth returns the items a Queue holds and their bytes (a ring's record
// bytes, with headers and padding, for the items in it).
func (q *Queue) Depth() (items, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.store.depth()
}

// Describe implements Object.
func (q *Queue) Describe() (string, int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.store.describe()
}

// describeLine is the status line of a queue holding items of bytes in
// all, with the store's note (", shared ring"); called under q.mu.
func (q *Queue) describeLine(items, bytes int64, note string, unfinished int64) string {
	max := "unbounded"
	if q.maxsize > 0 {
		max = fmt.Sprintf("max %d", q.maxsize)
	}
	return fmt.Sprintf("%d items, %d bytes, %s", items, bytes, max) + note + q.describeTasks(unfinished)
}

// describeTasks is a JoinableQueue's part of the status line ("" for a
// Queue); called under q.mu.
func (q *Queue) describeTasks(unfinished int64) string {
	if !q.joinable {
		return ""
	}
	st := fmt.Sprintf(", %d unfinished", unfinished)
	if q.abandoned > 0 {
		st += fmt.Sprintf(", %d marked done when their consumer's session ended", q.abandoned)
	}
	return st
}

// fail ends the queue: every waiter is woken with err (a ringStore's
// waiters too: each waits on its waiter's ready as well as on the ring).
func (q *Queue) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dead = err
	q.uncharge(q.held)
	q.getters.failAll(err)
	q.putters.failAll(err)
	q.joiners.failAll(err)
}
