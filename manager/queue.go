package manager

import (
	"container/list"
	"context"
	"fmt"
	"time"
)

// Queue is a FIFO of opaque items, as queue.Queue. Getters and putters that
// wait are served first come, first served; an item handed to a getter that
// is cancelled goes back to the front.
type Queue struct {
	base
	joinable   bool  // a JoinableQueue: counts unfinished tasks
	unfinished int64 // items put and not yet marked done (joinable without a ring; a ring counts them itself)
	joiners    waitQueue
	maxsize    int64 // <= 0: unbounded
	items      list.List
	bytes      int64
	lim        *byteLimits // nil: no byte limits
	held       int64       // counted bytes of items and waiting putters' items
	getters    waitQueue
	putters    waitQueue          // each carries the item it wants to put
	ring       *queueRing         // non-nil: the items are in a shared ring (queue_ring.go)
	owed       map[*Session]int64 // joinable: items each session got and has not marked done (queue_owed.go)
	abandoned  int64              // joinable: items marked done because their session ended
}

func newQueue(name string, maxsize int64) *Queue {
	return &Queue{base: base{name: name}, maxsize: maxsize}
}

// Kind implements Object.
func (q *Queue) Kind() Kind {
	if q.joinable {
		return KindJoinableQueue
	}
	return KindQueue
}

// accepted counts a put that succeeded; called under q.mu. A ring counts
// its puts itself (statemem.Ring.Unfinished).
func (q *Queue) accepted() {
	if q.joinable && q.ring == nil {
		q.unfinished++
	}
}

// TaskDone marks one item got from a JoinableQueue as processed; more calls
// than items put is ErrValue.
func (q *Queue) TaskDone() error { return q.TaskDoneBy(nil) }

func (q *Queue) taskDoneLocked(s *Session) error {
	if !q.joinable {
		return fmt.Errorf("%w: task_done on a queue that is not joinable", ErrType)
	}
	if q.ring != nil {
		return q.ringTaskDone(s)
	}
	if q.unfinished <= 0 {
		return fmt.Errorf("%w: task_done() called too many times", ErrValue)
	}
	q.payDebt(s)
	if q.unfinished--; q.unfinished == 0 {
		for w := q.joiners.front(); w != nil; w = q.joiners.front() {
			q.joiners.grant(w)
		}
	}
	return nil
}

// Join waits until every item put has been marked done. It reports false
// on timeout.
func (q *Queue) Join(ctx context.Context, timeout time.Duration) (bool, error) {
	if q.ring != nil {
		return q.ringJoin(ctx, timeout)
	}
	q.mu.Lock()
	if q.dead != nil {
		q.mu.Unlock()
		return false, q.dead
	}
	if q.unfinished == 0 {
		q.mu.Unlock()
		return true, nil
	}
	if timeout == 0 {
		q.mu.Unlock()
		return false, nil
	}
	w := newWaiter(nil, 0)
	q.joiners.push(w)
	return q.park(ctx, &q.joiners, w, timeout)
}

// Unfinished returns the number of unfinished tasks.
func (q *Queue) Unfinished() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ring != nil {
		return q.ringUnfinished()
	}
	return q.unfinished
}

func (q *Queue) full() bool {
	if q.ring != nil {
		return q.maxsize > 0 && int64(q.ringLen()) >= q.maxsize
	}
	return q.maxsize > 0 && int64(q.items.Len()) >= q.maxsize
}

func (q *Queue) pushBack(item []byte) {
	q.items.PushBack(item)
	q.bytes += int64(len(item))
}

func (q *Queue) popFront() []byte {
	e := q.items.Front()
	q.items.Remove(e)
	item := e.Value.([]byte)
	q.bytes -= int64(len(item))
	q.uncharge(ItemCost(item))
	return item
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
	if err := q.put(ctx, item, block, timeout); err != nil {
		return Grant{}, err
	}
	return Grant{ok: true}, nil
}

func (q *Queue) put(ctx context.Context, item []byte, block bool, timeout time.Duration) error {
	if q.ring != nil {
		return q.ringPut(ctx, item, block, timeout)
	}
	q.mu.Lock()
	if q.dead != nil {
		q.mu.Unlock()
		return q.dead
	}
	if q.handToGetter(item) { // the queue is empty: hand it over
		q.accepted()
		q.mu.Unlock()
		return nil
	}
	if !q.full() && q.putters.len() == 0 {
		if err := q.charge(ItemCost(item)); err != nil {
			q.mu.Unlock()
			return err
		}
		q.pushBack(item)
		q.accepted()
		q.mu.Unlock()
		return nil
	}
	if !block || timeout == 0 {
		q.mu.Unlock()
		return ErrFull
	}
	// A waiting putter's item is held too: counted now, given back if the
	// put does not happen.
	cost := ItemCost(item)
	if err := q.charge(cost); err != nil {
		q.mu.Unlock()
		return err
	}
	w := newWaiter(nil, 0)
	w.item = item
	return q.parkPutter(ctx, w, cost, timeout)
}

// parkPutter queues w (a put's item or a put_many's items, cost bytes
// already charged) until admitPutter lets it in, the timeout passes or ctx
// ends; called under q.mu, which it releases. A putter that leaves gives
// its bytes back, and the putters behind it that fit now are let in (a
// batch that left may have held back smaller puts).
func (q *Queue) parkPutter(ctx context.Context, w *waiter, cost int64, timeout time.Duration) error {
	q.putters.push(w)
	ok, err := q.park(ctx, &q.putters, w, timeout)
	if !ok {
		q.mu.Lock()
		if q.dead == nil { // fail gave back everything held
			q.uncharge(cost)
			q.admitPutter()
		}
		q.mu.Unlock()
	}
	switch {
	case ok: // in, also when the grant raced with ctx
		return nil
	case err != nil:
		return err
	default:
		return ErrFull
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
	if q.ring != nil {
		return q.ringGet(ctx, block, timeout)
	}
	q.mu.Lock()
	if q.dead != nil {
		q.mu.Unlock()
		return nil, q.dead
	}
	if q.items.Len() > 0 {
		item := q.popFront()
		q.admitPutter()
		q.mu.Unlock()
		return item, nil
	}
	if !block || timeout == 0 {
		q.mu.Unlock()
		return nil, ErrEmpty
	}
	w := newWaiter(nil, 0)
	q.getters.push(w)
	ok, err := q.park(ctx, &q.getters, w, timeout)
	switch {
	case ok: // also when the grant raced with ctx: the caller owns the item
		return w.item, nil
	case err != nil:
		return nil, err
	default:
		return nil, ErrEmpty
	}
}

// handToGetter gives item to the first waiting getter, if any, and
// reports whether it did (under q.mu).
func (q *Queue) handToGetter(item []byte) bool {
	w := q.getters.front()
	if w == nil {
		return false
	}
	w.item = item
	q.getters.grant(w)
	return true
}

// admitPutter moves the waiting putters' items into the queue, first come
// first served, while the first one's fit (a put_many's all together).
func (q *Queue) admitPutter() {
	for w := q.putters.front(); w != nil; w = q.putters.front() {
		if w.items == nil {
			if q.full() {
				return
			}
			q.pushBack(w.item)
			w.item = nil
			q.accepted()
		} else {
			if !q.roomFor(len(w.items)) {
				return
			}
			for _, it := range w.items {
				q.pushBack(it)
				q.accepted()
			}
			w.items = nil
		}
		q.putters.grant(w)
	}
}

// roomFor reports whether n more items fit under maxsize (a queue without
// a ring; under q.mu).
func (q *Queue) roomFor(n int) bool {
	return q.maxsize <= 0 || int64(q.items.Len()+n) <= q.maxsize
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
	if q.ring != nil {
		q.ringUnget(item)
		return nil
	}
	if q.handToGetter(item) {
		return nil
	}
	q.items.PushFront(item)
	q.bytes += int64(len(item))
	q.held += ItemCost(item)
	q.lim.force(ItemCost(item)) // an undo must not fail on a limit
	return nil
}

// Len returns the number of items.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ring != nil {
		return q.ringLen()
	}
	return q.items.Len()
}

// Full reports whether the queue is at its maxsize.
func (q *Queue) Full() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.full()
}

// Describe implements Object.
func (q *Queue) Describe() (string, int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ring != nil {
		return q.ringDescribe()
	}
	max := "unbounded"
	if q.maxsize > 0 {
		max = fmt.Sprintf("max %d", q.maxsize)
	}
	st := fmt.Sprintf("%d items, %d bytes, %s", q.items.Len(), q.bytes, max) + q.describeTasks(q.unfinished)
	return st, q.getters.len() + q.putters.len()
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

func (q *Queue) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dead = err
	q.uncharge(q.held)
	q.getters.failAll(err)
	q.putters.failAll(err)
	q.joiners.failAll(err)
	if q.ring != nil {
		q.ring.kick()
	}
}
