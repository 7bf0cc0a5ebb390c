package manager

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/syncmgr/syncmgr/statemem"
)

// A Queue on the fast path keeps its items in a ring in shared memory
// (statemem.Ring), where same-host clients put and get by themselves; the
// daemon serves socket clients from the same ring, under the same latch,
// so there is one FIFO. Besides the ring the daemon may hold items of its
// own, always at the ends of the FIFO:
//
//   - front: items of gets it undid (a reply nobody could receive), which
//     go back before everything in the ring;
//   - over: puts that found no room in the ring (an unbounded queue whose
//     ring is full), which come after everything in it;
//   - ext: items too large for the ring, which it names by an external
//     record at their place in the ring.
//
// While front holds anything the ring's daemon flag (RingFlagDaemon) sends
// every client op to the daemon, which serves front, ring and over in order.
// While only over holds items the over flag (RingFlagOver) sends clients'
// puts to the daemon (they queue behind over's items) but leaves their gets
// on the ring while it holds records. The daemon moves over's items into
// the ring as room appears: at every op it serves, and, while over holds
// anything, from the ring's watcher goroutine, which sleeps on the ring's
// seq and refills the ring once a consumer has drained half of it (so that
// a fast consumer rarely finds it empty and has to ask the daemon).
//
// ringStore is that Queue's queueStore. Its binding to a Queue, the
// sessions it was passed to and its release are in queue_ring_bind.go;
// its waiting (the daemon's waiters sleep on the ring's seq, through the
// watcher) in queue_ring_watch.go; its task counts in queue_ring_tasks.go.
// The daemon's waiters on a ring are not served by its changes as a
// listStore's are: each tries again when the ring changes (a socket
// client's put still hands its item to a waiting getter while the queue
// holds nothing, handOver).
type ringStore struct {
	name    string
	q       *Queue
	r       *statemem.Ring
	gone    func(uint32) bool // whether a slot's session ended (latch take-over)
	front   [][]byte
	over    [][]byte
	ext     map[uint64][]byte
	extNext uint64
	// idle is the ring's seq at the sweeper's last look (see trimQueues).
	idle atomic.Uint32

	wmu     sync.Mutex
	wch     chan struct{} // closed at the next change the watcher sees
	wn      int           // daemon waiters
	running bool
	refill  bool                // over holds items: the watcher refills the ring (written under q.mu and wmu)
	users   map[uint32]struct{} // session slots the ring was passed to (queue_attach) whose session has not ended
}

// corrupt stops using a scribbled ring: the queue fails with an error.
// Called under q.mu with the latch held.
func (qr *ringStore) corrupt(err error) error {
	q := qr.q
	e := fmt.Errorf("queue %q: %w; the queue is unusable", q.name, err)
	q.dead = e
	qr.setFlags() // the daemon flag; no more refills
	return e
}

// lock takes the ring's latch (statemem.Ring.Lock): ErrDeleted once the
// ring is closed; ErrLimit, naming the queue, when another client has held
// it for statemem.LatchWait (the op is refused, nothing done).
func (qr *ringStore) lock() error {
	err := qr.r.Lock(qr.gone)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, statemem.ErrLatchHeld):
		return fmt.Errorf("%w: queue %q: another client has held its shared ring's latch for %v (a stopped or "+
			"misbehaving process); try again, or end that process", ErrLimit, qr.q.name, statemem.LatchWait)
	default:
		return ErrDeleted
	}
}

// lockWaiting is lock for what must not be given up (an undo's item, a
// JoinableQueue's task counts): a latch a live client holds is waited for
// again, for as long as it takes, as every op did before LatchWait.
func (qr *ringStore) lockWaiting() error {
	for {
		if err := qr.lock(); !errors.Is(err, ErrLimit) {
			return err
		}
	}
}

// count is every item the queue holds (under q.mu and the latch).
func (qr *ringStore) count() (int64, error) {
	n, _, err := qr.r.Len()
	return int64(n) + int64(len(qr.front)+len(qr.over)), err
}

// charge is Queue.charge for bytes the daemon keeps for a Queue with a
// ring (an item outside the ring, a waiting putter's item): the per-object
// limit counts the ring's bytes too, so that the items in the ring, those
// the daemon keeps and the waiting putters' together stay under it. The
// ring's bytes are read without the latch (a moment's figure) and never
// taken as more than its capacity. Called under q.mu.
func (qr *ringStore) charge(n int64) error {
	q := qr.q
	_, used := qr.r.Peek()
	used = min(used, qr.r.Capacity())
	if err := q.lim.charge(q.held+int64(used), n); err != nil {
		return err
	}
	q.held += n
	return nil
}

// overLimit is the per-object limit's error for items that could never be
// held under it (nil: they might be), checked before a put looks at the
// ring: what clients put into the ring is not charged one by one, so it
// cannot wait for room under the limit.
func (qr *ringStore) overLimit(cost int64) error {
	if lim := qr.q.lim; lim != nil && lim.perObject > 0 && cost > lim.perObject {
		return lim.charge(0, cost)
	}
	return nil
}

// roomFor reports whether k more items fit: under maxsize, and for a
// JoinableQueue under the ring's bound on unfinished items (past it a put
// waits as on a full queue); n is what the queue holds now. Latch held; a
// ring whose count cannot be read fails the queue (err).
func (qr *ringStore) roomFor(k int) (n int64, room bool, err error) {
	q := qr.q
	if n, err = qr.count(); err != nil {
		return 0, false, qr.corrupt(err)
	}
	if q.maxsize > 0 && n+int64(k) > q.maxsize {
		return n, false, nil
	}
	if q.joinable && qr.r.Unfinished()+uint64(k) > statemem.RingMaxUnfinished {
		return n, false, nil
	}
	return n, true, nil
}

// tryPut stores item if there is room; called under q.mu. Items that
// find over non-empty go after it (the daemon first moves what fits of over
// into the ring), so the FIFO is one.
func (qr *ringStore) tryPut(item []byte) (ok bool, err error) {
	if err := qr.overLimit(ItemCost(item)); err != nil {
		return false, err
	}
	if err := qr.lock(); err != nil {
		return false, err
	}
	moved, handed := false, false
	defer func() {
		changed := (ok && !handed) || moved
		qr.r.UnlockQuiet(changed)
		if changed {
			qr.wakeLocal()
		}
	}()
	n, room, err := qr.roomFor(1)
	if !room || err != nil {
		return false, err
	}
	if n == 0 && qr.handOver(item) {
		handed = true
		return true, nil // a socket client's get took it: the ring did not change
	}
	if len(qr.over) > 0 {
		moved = qr.settle()
	}
	if _, err := qr.place(item, ItemCost(item), false); err != nil {
		return false, err
	}
	return true, nil
}

// tryPutMany stores all of items if there is room for all, else none;
// called under q.mu. Each item goes where tryPut would put it (to a
// waiting socket getter while the queue is empty, into the ring, named by
// an external record, or after over), all under one latch, so no other op
// sees part of the batch. A batch of one is a put.
func (qr *ringStore) tryPutMany(items [][]byte) (ok bool, err error) {
	if len(items) == 1 {
		return qr.tryPut(items[0])
	}
	if err := qr.overLimit(itemsCost(items)); err != nil {
		return false, err
	}
	q := qr.q
	if err := qr.lock(); err != nil {
		return false, err
	}
	changed := false
	defer func() { qr.unlockQuiet(changed) }()
	n, room, err := qr.roomFor(len(items))
	if !room || err != nil {
		return false, err
	}
	// The whole batch is charged first (all or nothing under the limits);
	// the items that go into the ring or to a getter give theirs back.
	if err := qr.charge(itemsCost(items)); err != nil {
		return false, err
	}
	if len(qr.over) > 0 && qr.settle() {
		changed = true
	}
	empty, whole := n == 0, itemsCost(items)
	for i := 0; i < len(items); {
		if empty && qr.handOver(items[i]) {
			q.uncharge(ItemCost(items[i]))
			i++
			continue
		}
		empty = false
		// The items from i that place would copy into the ring as they
		// are go in with one write of its tail (Ring.PutMany); the first
		// that finds no room, and any other, is placed alone.
		k, err := qr.putRun(items[i:])
		if err != nil {
			return true, err // a scribbled ring: the queue has failed
		}
		changed = changed || k > 0
		if i += k; i == len(items) {
			break
		}
		inRing, err := qr.place(items[i], whole, true)
		if err != nil {
			return true, err
		}
		changed = changed || inRing
		i++
	}
	qr.setFlags()
	return true, nil
}

// putRun copies into the ring the leading items of a charged batch that
// place would copy there (inline, nothing in over, and copied), as many as
// fit, with one store of the tail, and gives back their charge. It reports
// how many it stored. Latch held, under q.mu.
func (qr *ringStore) putRun(items [][]byte) (int, error) {
	if len(qr.over) > 0 {
		return 0, nil
	}
	inline, n := qr.r.Inline(), 0
	for _, item := range items {
		if uint64(len(item)) > inline || !qr.copied(item) {
			break
		}
		n++
	}
	if n == 0 {
		return 0, nil
	}
	k, err := qr.r.PutMany(statemem.RecItem, items[:n])
	if err != nil {
		return 0, qr.corrupt(err)
	}
	qr.q.uncharge(itemsCost(items[:k]))
	return k, nil
}

// place stores item where a put stores it, room checked: into the ring
// (copied), named by an external record (an item the daemon keeps: too
// large for the ring, or a large one that came through the daemon while
// no client has the ring: SocketKeepMin), or
// after over (no room in the ring). whole: what the request the item came
// in costs (ownItem: whether a kept item is copied out of its frame).
// charged: the item's cost is already
// counted (a batch's, charged whole), and is given back if it goes into
// the ring; otherwise it is counted here when the daemon keeps it, and a
// limit fails the put with nothing stored. inRing: a ring record was
// written. Latch held, under q.mu.
func (qr *ringStore) place(item []byte, whole int64, charged bool) (inRing bool, err error) {
	q := qr.q
	inline := uint64(len(item)) <= qr.r.Inline()
	keep := !inline // the daemon keeps it (also when the ring has room for it, passed to no client: SocketKeepMin)
	if len(qr.over) == 0 && inline {
		fits, err := qr.r.Fits(uint64(len(item)))
		if err != nil {
			return false, qr.corrupt(err)
		}
		if fits && qr.copied(item) {
			if err := qr.r.Put(statemem.RecItem, item); err != nil {
				return false, qr.corrupt(err)
			}
			if charged {
				q.uncharge(ItemCost(item))
			}
			return true, nil
		}
		keep = fits
	}
	if !charged {
		if err := qr.charge(ItemCost(item)); err != nil {
			return false, err
		}
	}
	if len(qr.over) == 0 && keep {
		// One that merely finds no room waits in over instead (an external
		// record sends a client's get to the daemon).
		if fits, _ := qr.r.Fits(8); fits {
			if err := qr.putExternal(ownItem(item, whole)); err != nil {
				return false, err
			}
			return true, nil
		}
	}
	qr.over = append(qr.over, ownItem(item, whole))
	if q.joinable {
		qr.r.AddDone(-1) // a put the ring's count does not see yet
	}
	qr.setFlags()
	return false, nil
}

// copied reports whether an inline item that fits goes into the ring as
// it is: it is small, or a client has the ring (a large one that no client
// takes from shared memory is kept by the daemon: SocketKeepMin). Under
// q.mu.
func (qr *ringStore) copied(item []byte) bool {
	return len(item) < SocketKeepMin || qr.passed()
}

// passed reports whether a client whose session lives has the ring
// (queue_attach). Under q.mu (q.mu, then wmu).
func (qr *ringStore) passed() bool {
	qr.wmu.Lock()
	defer qr.wmu.Unlock()
	return len(qr.users) > 0
}

// handOver gives item to the first of the daemon's waiting getters (a
// socket client's blocked get), as a listStore does, when the queue holds
// nothing (so the item is the head of the FIFO): the ring is not written
// and the getter takes it without a second look at the ring. It reports
// whether it did so (latch held, under q.mu). A JoinableQueue counts the
// put in its done word (unfinished is puts less done), as for an item in
// over.
func (qr *ringStore) handOver(item []byte) bool {
	if !qr.q.handToGetter(item) {
		return false
	}
	if qr.q.joinable {
		qr.r.AddDone(-1)
	}
	return true
}

// tryGet removes the first item; called under q.mu.
func (qr *ringStore) tryGet() (item []byte, ok bool, err error) {
	if err := qr.lock(); err != nil {
		return nil, false, err
	}
	defer func() { qr.unlockQuiet(ok) }()
	if item, ok, err = qr.take(); ok {
		qr.settle()
	}
	return item, ok, err
}

// tryGetMany removes up to max items in order, within budget, under one
// latch, and moves what over holds into the ring once, after them (so
// that no item of over is copied into the ring and back out by the same
// batch). Called under q.mu.
func (qr *ringStore) tryGetMany(items [][]byte, max int, budget int64) (_ [][]byte, err error) {
	if err := qr.lock(); err != nil {
		return items, err
	}
	changed := false
	defer func() { qr.unlockQuiet(changed) }()
	for end := len(items) + max; len(items) < end; {
		if len(qr.front) == 0 {
			// The ring's run of item records, with one look at its words
			// and one store of its head (Ring.GetMany); what stopped it (an
			// external record, the budget, an empty ring) is the next
			// item's to say.
			got, used, gerr := qr.r.GetMany(end-len(items), budget, batchItemFraming)
			if gerr != nil {
				err = qr.corrupt(gerr)
				break
			}
			if len(got) > 0 {
				changed = true
				budget -= used
				items = append(items, got...)
				continue
			}
		}
		if size, ok := qr.nextSize(); !ok || int64(size)+batchItemFraming > budget {
			break // an item over the reply's budget stays where it is (not in front, where it would send every client to the daemon)
		}
		item, ok, terr := qr.take()
		if terr != nil || !ok {
			err = terr
			break
		}
		changed = true
		n := int64(len(item)) + batchItemFraming
		if n > budget { // (the ring's record changed under the latch: a scribbling client)
			qr.pushFront(item)
			break
		}
		budget -= n
		items = append(items, item)
	}
	if changed {
		qr.settle() // (and the flags, front's included)
	}
	return items, err
}

// nextSize is the size of the item take would return, and false when the
// queue holds none (or the ring's head record is not readable; take then
// says why). Latch held, under q.mu.
func (qr *ringStore) nextSize() (int, bool) {
	if len(qr.front) > 0 {
		return len(qr.front[0]), true
	}
	kind, p, got, err := qr.r.Head()
	switch {
	case err != nil:
		return 0, true // take reports the corruption
	case got && kind == statemem.RecExternal:
		return len(qr.ext[binary.LittleEndian.Uint64(p)]), true
	case got:
		return len(p), true
	case len(qr.over) > 0:
		return len(qr.over[0]), true
	}
	return 0, false
}

// take removes the first item, from front, the ring or over in that
// order. Latch held, under q.mu; the caller settles.
func (qr *ringStore) take() (item []byte, ok bool, err error) {
	q := qr.q
	if len(qr.front) > 0 {
		item = qr.front[0]
		qr.front = qr.front[1:]
		q.uncharge(ItemCost(item))
		return item, true, nil
	}
	kind, p, got, err := qr.r.Get()
	switch {
	case err != nil:
		return nil, false, qr.corrupt(err)
	case got:
		if item = qr.fromRecord(kind, p); item == nil {
			return nil, false, qr.corrupt(fmt.Errorf("unknown external item"))
		}
		if kind == statemem.RecExternal {
			q.uncharge(ItemCost(item))
		}
		return item, true, nil
	case len(qr.over) > 0:
		item = qr.over[0]
		qr.over = qr.over[1:]
		q.uncharge(ItemCost(item))
		return item, true, nil
	}
	return nil, false, nil
}

// putExternal keeps item in the daemon and writes the 8-byte external
// record that names it at the tail (an 8-byte record fits; latch held). An
// error (the ring's words changed since the caller's Fits) fails the
// queue, with item not kept.
func (qr *ringStore) putExternal(item []byte) error {
	qr.extNext++
	var id [8]byte
	binary.LittleEndian.PutUint64(id[:], qr.extNext)
	if err := qr.r.Put(statemem.RecExternal, id[:]); err != nil {
		return qr.corrupt(err)
	}
	qr.ext[qr.extNext] = item
	return nil
}

// fromRecord is a record's item (nil: an external id the daemon does not
// know). An external item leaves ext (its charge is the caller's).
func (qr *ringStore) fromRecord(kind uint32, p []byte) []byte {
	if kind != statemem.RecExternal {
		return p
	}
	id := binary.LittleEndian.Uint64(p)
	item, ok := qr.ext[id]
	if !ok {
		return nil
	}
	delete(qr.ext, id)
	return item
}

// SocketKeepMin is the size from which an item put through the daemon
// into a ring with room for it (a socket client's put, mostly) stays in the
// daemon's memory, named by an external record, instead of being copied
// into the ring, while the ring has not been passed to any client: the
// daemon already holds it (the request's bytes) and a socket client that
// gets it takes it with no copy. Once a same-host client has the ring
// (queue_attach), such items are copied into the ring too, as smaller ones
// always are: a fast getter then takes them from shared memory, with no
// round trip and no socket transfer (a remote producer's arrays feeding a
// local consumer), and a socket getter pays one copy out of the ring.
const SocketKeepMin = 64 << 10

// settle moves over's items into the ring, in order, while they fit (and
// front is empty), and sets the flags for what the daemon still holds. It
// reports whether it moved any (latch held, under q.mu).
func (qr *ringStore) settle() (moved bool) {
	q := qr.q
	for len(qr.front) == 0 && len(qr.over) > 0 {
		item := qr.over[0]
		// Over's items are copied into the ring up to the inline limit,
		// whatever their size: they are mostly fast clients' puts that found
		// the ring full, for fast clients to get.
		if uint64(len(item)) <= qr.r.Inline() {
			if ok, _ := qr.r.Fits(uint64(len(item))); !ok {
				break
			}
			if err := qr.r.Put(statemem.RecItem, item); err != nil {
				qr.corrupt(err)
				break
			}
			q.uncharge(ItemCost(item))
		} else {
			if ok, _ := qr.r.Fits(8); !ok {
				break
			}
			if qr.putExternal(item) != nil {
				break
			}
		}
		if q.joinable {
			qr.r.AddDone(1) // the ring's put count sees it now
		}
		qr.over[0] = nil
		qr.over = qr.over[1:]
		moved = true
	}
	if len(qr.over) == 0 {
		qr.over = nil // let go of the backing array
	}
	qr.setFlags()
	return moved
}

// setFlags writes the ring's flags for what the daemon holds outside it,
// and starts the watcher's refills while over holds anything (latch held,
// under q.mu).
func (qr *ringStore) setFlags() {
	q := qr.q
	var f uint64
	if len(qr.front) > 0 || q.dead != nil {
		f |= statemem.RingFlagDaemon
	}
	if len(qr.over) > 0 {
		f |= statemem.RingFlagOver
	}
	qr.r.SetFlags(f)
	refill := len(qr.over) > 0 && q.dead == nil
	qr.wmu.Lock()
	qr.refill = refill
	if refill {
		qr.startWatch(qr.r.Seq())
	}
	qr.wmu.Unlock()
}

// unget puts an item back at the front (the undo of a get), or hands it
// to the daemon's first waiting getter (it is the head of the FIFO); a
// removed queue's ring takes nothing.
func (qr *ringStore) unget(item []byte) {
	q := qr.q
	if qr.lockWaiting() != nil { // an undo must not lose its item
		return
	}
	if q.handToGetter(item) {
		qr.r.UnlockQuiet(false)
		return
	}
	defer qr.unlock(true)
	qr.pushFront(item)
	qr.setFlags()
}

// pushFront puts item back at the head, in front, counted whatever the
// limits say (an item given back must not fail); the caller sets the
// flags, whose daemon flag then sends every op to the daemon. Latch held,
// under q.mu.
func (qr *ringStore) pushFront(item []byte) {
	item = bytes.Clone(item) // (a view of a request's frame, whose size is not known here: a rare path)
	qr.front = append([][]byte{item}, qr.front...)
	qr.q.held += ItemCost(item)
	qr.q.lim.force(ItemCost(item))
}

// admit lets in nobody: the daemon's putters on a ring try again whenever
// it changes (wait).
func (qr *ringStore) admit() {}

// refillFromOver is the watcher's refill: when over holds items and a
// consumer has drained at least half of the ring, move what fits. Lock
// order: q.mu, then the latch (as every op). It reports whether over
// still holds items.
func (qr *ringStore) refillFromOver() bool {
	if _, used := qr.r.Peek(); used > qr.r.Capacity()/2 {
		return true // not yet: refill in batches, not one record per get
	}
	q := qr.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead != nil || q.store != queueStore(qr) || len(qr.over) == 0 {
		qr.wmu.Lock()
		qr.refill = false
		qr.wmu.Unlock()
		return false
	}
	if qr.lock() != nil {
		qr.wmu.Lock()
		qr.refill = false
		qr.wmu.Unlock()
		return false
	}
	moved := qr.settle() // clears refill when over is empty (a scribbled ring takes nothing: Fits fails)
	qr.unlock(moved)
	return len(qr.over) > 0
}

// len is every item the queue holds (under q.mu; the ring's count without
// the latch).
func (qr *ringStore) len() int {
	n, _ := qr.r.Peek()
	return int(n) + len(qr.front) + len(qr.over)
}

// depth counts a ring's record bytes, with headers and padding, for the
// items in it.
func (qr *ringStore) depth() (items, bytes int64) {
	n, b := qr.r.Peek()
	items, bytes = int64(n)+int64(len(qr.front)+len(qr.over)), int64(b)
	for _, x := range qr.front {
		bytes += int64(len(x))
	}
	for _, x := range qr.over {
		bytes += int64(len(x))
	}
	for _, x := range qr.ext {
		bytes += int64(len(x))
	}
	return items, bytes
}

// describe counts the daemon's waiters (wait) and the clients' asleep on
// the ring.
func (qr *ringStore) describe() (string, int) {
	items, bytes := qr.depth()
	qr.wmu.Lock()
	dw := qr.wn
	qr.wmu.Unlock()
	return qr.q.describeLine(items, bytes, ", shared ring", int64(qr.r.UnfinishedNow())), dw + qr.r.Waiting()
}
