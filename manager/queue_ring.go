package manager

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
type queueRing struct {
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

// DefaultQueueRingBytes is the data capacity of each Queue's ring unless
// Config.QueueRingBytes says otherwise; an item of more than a quarter of
// it is kept by the daemon (see queueRing.ext). The ring's memory file is
// sparse: a queue of small items touches only the ring's hot window
// (statemem.RingHot), and the sweeper gives back the pages past it once the
// ring is empty and idle (trimQueues). MaxQueueRings bounds the rings (each
// holds a descriptor and its mapping in the daemon); later Queues keep
// their items in the daemon.
const (
	DefaultQueueRingBytes = 64 << 20
	MaxQueueRings         = 1024
)

// queueRingBytes is the ring capacity for a configured size: the default
// for 0, else the power of two at or above it, at most
// statemem.RingMaxCapacity.
func queueRingBytes(n int64) uint64 {
	if n <= 0 {
		n = DefaultQueueRingBytes
	}
	return statemem.RingSize(n)
}

// queueFamily is the fast-path family of Queues and JoinableQueues (see
// fastFamily): each has a ring of its own, outside the segment.
type queueFamily struct{}

func (queueFamily) kinds() []Kind { return []Kind{KindQueue, KindJoinableQueue} }

func (queueFamily) bind(f *fastPath, obj Object) { f.bindQueue(obj.(*Queue), f.perObject) }

func (queueFamily) unbind(f *fastPath, obj Object) { f.unbindQueue(obj.(*Queue)) }

func (queueFamily) tick(f *fastPath) { f.trimQueues() }

func (queueFamily) slotEnded(f *fastPath, slot Slot) { f.releaseQueueSlots(slot) }

// trimQueues gives back the pages past the hot window of every ring that
// was empty and unchanged since the sweeper's previous look (the sweeper
// calls it every sweepEvery). It never waits for a latch.
func (f *fastPath) trimQueues() {
	f.mu.Lock()
	rings := make([]*queueRing, 0, len(f.queues))
	for _, qr := range f.queues {
		rings = append(rings, qr)
	}
	f.mu.Unlock()
	for _, qr := range rings {
		seq, _, _ := qr.r.Trim(qr.idle.Load()) // an error (none expected from tmpfs) leaves the pages: harmless
		qr.idle.Store(seq)
	}
}

// bindQueue gives a new Queue or JoinableQueue a ring (a JoinableQueue's
// task counts are in it too: queue_owed.go). A failure is not an error: the
// queue keeps its items in the daemon.
func (f *fastPath) bindQueue(q *Queue, perObject int64) {
	// A ring holds at most --max-object-bytes (rounded down to a power of
	// two): what clients put into it is not charged one by one, and what
	// the daemon adds is charged with the ring's bytes counted (ringCharge).
	capacity := f.ringBytes
	for perObject > 0 && capacity > 4096 && capacity > uint64(perObject) {
		capacity >>= 1
	}
	inline := capacity / 4
	if perObject > 0 && uint64(perObject-ItemOverhead) < inline {
		if perObject <= ItemOverhead {
			return
		}
		inline = uint64(perObject - ItemOverhead)
	}
	if f.maxItem > 0 && uint64(f.maxItem) < inline {
		inline = uint64(f.maxItem) // every ring item fits a reply frame
	}
	maxsize := uint64(0)
	if q.maxsize > 0 {
		maxsize = uint64(q.maxsize)
	}
	f.mu.Lock()
	full := len(f.queues) >= MaxQueueRings
	f.mu.Unlock()
	if full {
		return
	}
	r, err := statemem.NewRing(capacity, maxsize, inline)
	if err != nil {
		return
	}
	qr := &queueRing{name: q.name, q: q, r: r, ext: make(map[uint64][]byte), wch: make(chan struct{}),
		gone: func(s uint32) bool { return f.slotGone(Slot(s)) }}
	q.mu.Lock()
	q.ring = qr
	q.mu.Unlock()
	f.mu.Lock()
	if f.queues == nil {
		f.queues = make(map[*Queue]*queueRing)
	}
	f.queues[q] = qr
	f.mu.Unlock()
}

// unbindQueue closes a removed Queue's ring (clients' maps stay valid and
// find its daemon flag set).
func (f *fastPath) unbindQueue(q *Queue) {
	f.mu.Lock()
	qr := f.queues[q]
	delete(f.queues, q)
	f.mu.Unlock()
	if qr != nil {
		_ = qr.r.Close()
	}
}

// Ring returns the Queue's ring, or nil when its items are in the daemon.
func (q *Queue) Ring() *statemem.Ring {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ring == nil || q.dead != nil {
		return nil
	}
	return q.ring.r
}

// QueueWaiting is a fast-path client's thread asleep on a Queue's ring.
type QueueWaiting struct {
	Session uint64
	Kind    string // wire kind: "queue" or "joinable_queue"
	Name    string
	Op      string    // "get", "put" or "join" ("" unknown)
	Since   time.Time // zero: unknown
	Count   int       // threads of that session waiting so
}

// QueueWaiting lists the sessions asleep on Queue rings now, for status.
func (m *Manager) QueueWaiting() []QueueWaiting {
	m.mu.RLock()
	f := m.fast
	m.mu.RUnlock()
	if f == nil {
		return nil
	}
	f.mu.Lock()
	rings := make([]*queueRing, 0, len(f.queues))
	for _, qr := range f.queues {
		rings = append(rings, qr)
	}
	f.mu.Unlock()
	var out []QueueWaiting
	for _, qr := range rings {
		for _, w := range qr.r.Waiters() {
			f.mu.Lock()
			s := f.attached[Slot(w.Slot)]
			f.mu.Unlock()
			if s == nil {
				continue
			}
			op := map[uint32]string{statemem.RingWaitGet: "get", statemem.RingWaitPut: "put", statemem.RingWaitJoin: "join"}[w.Op]
			kind := "queue"
			if qr.q.joinable {
				kind = "joinable_queue"
			}
			out = append(out, QueueWaiting{Session: s.ID, Kind: kind, Name: qr.name, Op: op, Since: w.Since, Count: w.Count})
		}
	}
	return out
}

// RingPassed records that the session in slot was given q's ring (a
// queue_attach, just before the reply that carries it): from now on the
// ring may change without the daemon, so its daemon waiters need the
// watcher (queueRing.wait) until that session ends.
func (q *Queue) RingPassed(slot Slot) {
	q.mu.Lock()
	qr := q.ring
	q.mu.Unlock()
	if qr == nil {
		return
	}
	qr.wmu.Lock()
	defer qr.wmu.Unlock()
	if qr.users == nil {
		qr.users = make(map[uint32]struct{})
	}
	qr.users[uint32(slot)] = struct{}{}
	if qr.wn > 0 {
		qr.startWatch(qr.r.Seq())
	}
}

// releaseQueueSlots lets go of the latch and the waiter counts of a
// session that ended, on every ring, and forgets it as a user of each. It
// takes no lock the daemon's ops hold while they wait for a latch.
func (f *fastPath) releaseQueueSlots(slot Slot) {
	f.mu.Lock()
	rings := make([]*queueRing, 0, len(f.queues))
	for _, qr := range f.queues {
		rings = append(rings, qr)
	}
	f.mu.Unlock()
	for _, qr := range rings {
		qr.wmu.Lock()
		_, user := qr.users[uint32(slot)]
		delete(qr.users, uint32(slot))
		qr.wmu.Unlock()
		if qr.r.ReleaseLatch(uint32(slot)) || user {
			// What the session (or the daemon for it) changed last may be
			// news to the daemon's waiters, and the watcher may stop now.
			qr.wakeLocal()
		}
		if qr.q.joinable && slot < statemem.RingSlots {
			qr.q.ringReleaseOwed(uint32(slot), nil)
		}
	}
}

// corrupt stops using a scribbled ring: the queue fails with an error.
// Called under q.mu with the latch held.
func (q *Queue) corrupt(err error) error {
	e := fmt.Errorf("queue %q: %w; the queue is unusable", q.name, err)
	q.dead = e
	q.setFlags() // the daemon flag; no more refills
	return e
}

// ringCount is every item the queue holds (under q.mu and the latch).
func (q *Queue) ringCount() (int64, error) {
	n, _, err := q.ring.r.Len()
	return int64(n) + int64(len(q.ring.front)+len(q.ring.over)), err
}

// ringCharge is charge for bytes the daemon keeps for a Queue with a ring
// (an item outside the ring, a waiting putter's item): the per-object
// limit counts the ring's bytes too, so that the items in the ring, those
// the daemon keeps and the waiting putters' together stay under it. The
// ring's bytes are read without the latch (a moment's figure) and never
// taken as more than its capacity. Called under q.mu.
func (q *Queue) ringCharge(n int64) error {
	_, used := q.ring.r.Peek()
	used = min(used, q.ring.r.Capacity())
	if err := q.lim.charge(q.held+int64(used), n); err != nil {
		return err
	}
	q.held += n
	return nil
}

// ringTryPut stores item if there is room; called under q.mu. Items that
// find over non-empty go after it (the daemon first moves what fits of over
// into the ring), so the FIFO is one.
func (q *Queue) ringTryPut(item []byte) (ok bool, err error) {
	qr := q.ring
	if !qr.r.Lock(qr.gone) {
		return false, ErrDeleted
	}
	moved, handed := false, false
	defer func() {
		changed := (ok && !handed) || moved
		qr.r.UnlockQuiet(changed)
		if changed {
			qr.wakeLocal()
		}
	}()
	n, err := q.ringCount()
	if err != nil {
		return false, q.corrupt(err)
	}
	if q.maxsize > 0 && n >= q.maxsize {
		return false, nil
	}
	if q.joinable && qr.r.Unfinished() >= statemem.RingMaxUnfinished {
		return false, nil // the unfinished count is at its bound: wait as on a full queue
	}
	if n == 0 && q.handOver(item) {
		handed = true
		return true, nil // a socket client's get took it: the ring did not change
	}
	if len(qr.over) > 0 {
		moved = q.settle()
	}
	inline := uint64(len(item)) <= qr.r.Inline()
	keep := false // the ring has room for it, but the daemon keeps it (SocketKeepMin)
	if len(qr.over) == 0 && inline {
		ok, err := qr.r.Fits(uint64(len(item)))
		if err != nil {
			return false, q.corrupt(err)
		}
		if ok && len(item) < SocketKeepMin {
			qr.r.Put(statemem.RecItem, item)
			q.accepted()
			return true, nil
		}
		keep = ok
	}
	if err := q.ringCharge(ItemCost(item)); err != nil {
		return false, err
	}
	if len(qr.over) == 0 && (!inline || keep) {
		// Only an item the daemon keeps (too large for the ring, or a large
		// one that came through the daemon) is named by an external record:
		// one that merely finds no room waits in over (an external record
		// sends a client's get to the daemon).
		if ok, _ := qr.r.Fits(8); ok {
			qr.putExternal(item)
			q.accepted()
			return true, nil
		}
	}
	qr.over = append(qr.over, item)
	if q.joinable {
		qr.r.AddDone(-1) // a put the ring's count does not see yet
	}
	q.setFlags()
	return true, nil
}

// handOver gives item to the first of the daemon's waiting getters (a
// socket client's blocked get), as a queue without a ring does, when the
// queue holds nothing (so the item is the head of the FIFO): the ring is not
// written and the getter takes it without a second look at the ring. It
// reports whether it did so (latch held, under q.mu). A JoinableQueue
// counts the put in its done word (unfinished is puts less done), as for an
// item in over.
func (q *Queue) handOver(item []byte) bool {
	if !q.handToGetter(item) {
		return false
	}
	if q.joinable {
		q.ring.r.AddDone(-1)
	}
	return true
}

// ringTryGet removes the first item; called under q.mu.
func (q *Queue) ringTryGet() (item []byte, ok bool, err error) {
	qr := q.ring
	if !qr.r.Lock(qr.gone) {
		return nil, false, ErrDeleted
	}
	defer func() {
		qr.r.UnlockQuiet(ok)
		if ok {
			qr.wakeLocal()
		}
	}()
	if len(qr.front) > 0 {
		item = qr.front[0]
		qr.front = qr.front[1:]
		q.uncharge(ItemCost(item))
	} else {
		kind, p, got, err := qr.r.Get()
		switch {
		case err != nil:
			return nil, false, q.corrupt(err)
		case got:
			if item = q.fromRecord(kind, p); item == nil {
				return nil, false, q.corrupt(fmt.Errorf("unknown external item"))
			}
			if kind == statemem.RecExternal {
				q.uncharge(ItemCost(item))
			}
		case len(qr.over) > 0:
			item = qr.over[0]
			qr.over = qr.over[1:]
			q.uncharge(ItemCost(item))
		default:
			return nil, false, nil
		}
	}
	q.settle()
	return item, true, nil
}

// putExternal keeps item in the daemon and writes the 8-byte external
// record that names it at the tail (an 8-byte record fits; latch held).
func (qr *queueRing) putExternal(item []byte) {
	qr.extNext++
	var id [8]byte
	binary.LittleEndian.PutUint64(id[:], qr.extNext)
	qr.ext[qr.extNext] = item
	qr.r.Put(statemem.RecExternal, id[:])
}

// fromRecord is a record's item (nil: an external id the daemon does not
// know). An external item leaves ext (its charge is the caller's).
func (q *Queue) fromRecord(kind uint32, p []byte) []byte {
	if kind != statemem.RecExternal {
		return p
	}
	id := binary.LittleEndian.Uint64(p)
	item, ok := q.ring.ext[id]
	if !ok {
		return nil
	}
	delete(q.ring.ext, id)
	return item
}

// SocketKeepMin is the size from which an item put through the daemon
// into a ring with room for it (a socket client's put, mostly) stays in the
// daemon's memory, named by an external record, instead of being
// copied into the ring: the daemon already holds it (the request's bytes),
// a socket client that gets it takes it with no copy, and a fast client
// that gets it takes the socket, which carried it in anyway. Smaller items
// are copied into the ring, where fast clients get them with no round trip.
const SocketKeepMin = 64 << 10

// settle moves over's items into the ring, in order, while they fit (and
// front is empty), and sets the flags for what the daemon still holds. It
// reports whether it moved any (latch held, under q.mu).
func (q *Queue) settle() (moved bool) {
	qr := q.ring
	for len(qr.front) == 0 && len(qr.over) > 0 {
		item := qr.over[0]
		// Over's items are copied into the ring up to the inline limit,
		// whatever their size: they are mostly fast clients' puts that found
		// the ring full, for fast clients to get.
		if uint64(len(item)) <= qr.r.Inline() {
			if ok, _ := qr.r.Fits(uint64(len(item))); !ok {
				break
			}
			qr.r.Put(statemem.RecItem, item)
			q.uncharge(ItemCost(item))
		} else {
			if ok, _ := qr.r.Fits(8); !ok {
				break
			}
			qr.putExternal(item)
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
	q.setFlags()
	return moved
}

// setFlags writes the ring's flags for what the daemon holds outside it,
// and starts the watcher's refills while over holds anything (latch held,
// under q.mu).
func (q *Queue) setFlags() {
	qr := q.ring
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

// ringUnget puts an item back at the front (the undo of a get), or hands
// it to the daemon's first waiting getter (it is the head of the FIFO); a
// removed queue's ring takes nothing.
func (q *Queue) ringUnget(item []byte) {
	qr := q.ring
	if !qr.r.Lock(qr.gone) {
		return
	}
	if q.handToGetter(item) {
		qr.r.UnlockQuiet(false)
		return
	}
	defer qr.unlock(true)
	qr.front = append([][]byte{item}, qr.front...)
	q.held += ItemCost(item)
	q.lim.force(ItemCost(item))
	q.setFlags()
}

// refillFromOver is the watcher's refill: when over holds items and a
// consumer has drained at least half of the ring, move what fits. Lock
// order: q.mu, then the latch (as every op). It reports whether over
// still holds items.
func (qr *queueRing) refillFromOver() bool {
	if _, used := qr.r.Peek(); used > qr.r.Capacity()/2 {
		return true // not yet: refill in batches, not one record per get
	}
	q := qr.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead != nil || q.ring != qr || len(qr.over) == 0 {
		qr.wmu.Lock()
		qr.refill = false
		qr.wmu.Unlock()
		return false
	}
	if !qr.r.Lock(qr.gone) {
		qr.wmu.Lock()
		qr.refill = false
		qr.wmu.Unlock()
		return false
	}
	moved := q.settle() // clears refill when over is empty (a scribbled ring takes nothing: Fits fails)
	qr.unlock(moved)
	return len(qr.over) > 0
}

// ringPut is put for a Queue with a ring: it retries whenever the ring
// changes, until the deadline. A waiting putter's item counts against the
// byte limits while it waits, as on a queue without a ring.
func (q *Queue) ringPut(ctx context.Context, item []byte, block bool, timeout time.Duration) error {
	return q.ringPutItems(ctx, [][]byte{item}, block, timeout)
}

// ringPutItems puts items, all together (adjacent and in order) or none
// (a batch of more than one: ringTryPutMany).
func (q *Queue) ringPutItems(ctx context.Context, items [][]byte, block bool, timeout time.Duration) error {
	cost := itemsCost(items)
	if q.lim != nil && q.lim.perObject > 0 && cost > q.lim.perObject {
		return q.lim.charge(0, cost) // the per-object limit's error
	}
	try := q.ringTryPutMany
	if len(items) == 1 {
		try = func(items [][]byte) (bool, error) { return q.ringTryPut(items[0]) }
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	waiting := false
	defer func() {
		if waiting {
			q.mu.Lock()
			if q.dead == nil { // fail gave back everything held
				q.uncharge(cost)
			}
			q.mu.Unlock()
		}
	}()
	for {
		q.mu.Lock()
		if q.dead != nil {
			q.mu.Unlock()
			return q.dead
		}
		qr := q.ring
		seen := qr.r.Seq()
		if waiting { // the items' own charge is made by the put, for those the daemon keeps
			q.uncharge(cost)
			waiting = false
		}
		ok, err := try(items)
		if !ok && err == nil && block && timeout != 0 {
			if err = q.ringCharge(cost); err == nil {
				waiting = true
			}
		}
		q.mu.Unlock()
		if ok || err != nil {
			return err
		}
		if !block || timeout == 0 {
			return ErrFull
		}
		if err := qr.wait(ctx, seen, deadline, nil); err != nil {
			if err == errTimeout {
				return ErrFull
			}
			return err
		}
	}
}

// ringGet is get for a Queue with a ring.
func (q *Queue) ringGet(ctx context.Context, block bool, timeout time.Duration) ([]byte, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		q.mu.Lock()
		if q.dead != nil {
			q.mu.Unlock()
			return nil, q.dead
		}
		qr := q.ring
		seen := qr.r.Seq()
		item, ok, err := q.ringTryGet()
		if err != nil || ok {
			q.mu.Unlock()
			return item, err
		}
		if !block || timeout == 0 {
			q.mu.Unlock()
			return nil, ErrEmpty
		}
		// Wait for a change of the ring (a fast client's put) or for a
		// socket client's put handed over (handOver).
		w := newWaiter(nil, 0)
		q.getters.push(w)
		q.mu.Unlock()
		err = qr.wait(ctx, seen, deadline, w.ready)
		q.mu.Lock()
		removed := q.getters.remove(w)
		q.mu.Unlock()
		if !removed { // handed an item (also when that raced with ctx: the caller owns it), or failed
			<-w.ready
			return w.item, w.err
		}
		if err != nil {
			if err == errTimeout {
				return nil, ErrEmpty
			}
			return nil, err
		}
	}
}

// lonePoll bounds a daemon waiter's sleep on a ring no live session was
// passed (see wait). A variable for tests.
var lonePoll = 50 * time.Millisecond

type timeoutError struct{}

func (timeoutError) Error() string { return "timeout" }

var errTimeout error = timeoutError{}

// wait returns when the ring's seq moves from seen (or may have: spurious
// returns are fine, callers retry), when ready closes (nil: never), at the
// deadline (errTimeout; zero: none) or when ctx ends.
//
// The daemon's own changes wake its waiters at once (wakeLocal). Changes
// fast-path clients make are seen by one watcher goroutine per ring, which
// sleeps on the futex for all the daemon's waiters while any session the
// ring was passed to lives (RingPassed): a ring only socket clients use
// costs no thread asleep in a system call. Without a watcher a waiter
// still looks again every lonePoll, a bound on a change made by a process
// that kept the ring past its session's end.
func (qr *queueRing) wait(ctx context.Context, seen uint32, deadline time.Time, ready <-chan struct{}) error {
	qr.wmu.Lock()
	ch := qr.wch
	qr.wn++
	watched := len(qr.users) > 0 || qr.refill
	if watched {
		qr.startWatch(seen)
	}
	qr.wmu.Unlock()
	defer func() {
		qr.wmu.Lock()
		qr.wn--
		qr.wmu.Unlock()
	}()
	if qr.r.Seq() != seen {
		return nil
	}
	var tc <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return errTimeout
		}
		t := time.NewTimer(d)
		defer t.Stop()
		tc = t.C
	}
	var poll <-chan time.Time
	if !watched {
		t := time.NewTimer(lonePoll)
		defer t.Stop()
		poll = t.C
	}
	select {
	case <-ch:
		return nil
	case <-ready: // nil: never
		return nil
	case <-poll:
		return nil
	case <-tc:
		return errTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wakeLocal wakes the daemon's own waiters on the ring (socket clients'
// gets, puts and joins) after a change the daemon made itself, at once
// rather than through the watcher, whose futex the change then need not
// wake (UnlockQuiet): the watcher sees it at its next look (a spurious
// retry at most). Called under q.mu (q.mu, then wmu).
func (qr *queueRing) wakeLocal() {
	qr.wmu.Lock()
	if qr.wn > 0 {
		close(qr.wch)
		qr.wch = make(chan struct{})
	}
	qr.wmu.Unlock()
}

// unlock lets go of the latch after a daemon op and, when the op changed
// the ring, wakes the daemon's waiters at once (wakeLocal) and clients
// through the futex.
func (qr *queueRing) unlock(changed bool) {
	qr.r.Unlock(changed)
	if changed {
		qr.wakeLocal()
	}
}

// kick wakes the daemon's waiters (the queue failed).
func (qr *queueRing) kick() {
	qr.wmu.Lock()
	close(qr.wch)
	qr.wch = make(chan struct{})
	qr.wmu.Unlock()
}

// startWatch starts the watcher from seq last unless it runs (under wmu).
func (qr *queueRing) startWatch(last uint32) {
	if !qr.running {
		qr.running = true
		go qr.watch(last)
	}
}

// watch sleeps on the ring's seq while the daemon has waiters or over holds
// items; it wakes the waiters at every change (and every 20 ms, a bound on
// anything missed) and refills the ring from over (refillFromOver). It
// takes no lock while it sleeps, and q.mu (then the latch) only to refill.
func (qr *queueRing) watch(last uint32) {
	for {
		cur := qr.r.Seq()
		if cur == last {
			qr.r.Sleep(cur, 20*time.Millisecond)
			cur = qr.r.Seq()
		}
		last = cur
		qr.wmu.Lock()
		close(qr.wch)
		qr.wch = make(chan struct{})
		refill := qr.refill
		qr.wmu.Unlock()
		if refill {
			qr.refillFromOver()
		}
		qr.wmu.Lock()
		if (qr.wn == 0 || len(qr.users) == 0) && !qr.refill {
			qr.running = false
			qr.wmu.Unlock()
			return
		}
		qr.wmu.Unlock()
	}
}

// Depth returns the items a Queue holds and their bytes (a ring's record
// bytes, with headers and padding, for the items in it).
func (q *Queue) Depth() (items, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ring == nil {
		return int64(q.items.Len()), q.bytes
	}
	return q.ringDepth()
}

func (q *Queue) ringDepth() (items, bytes int64) {
	n, b := q.ring.r.Peek()
	items, bytes = int64(n)+int64(len(q.ring.front)+len(q.ring.over)), int64(b)
	for _, x := range q.ring.front {
		bytes += int64(len(x))
	}
	for _, x := range q.ring.over {
		bytes += int64(len(x))
	}
	for _, x := range q.ring.ext {
		bytes += int64(len(x))
	}
	return items, bytes
}

// ringLen is Len for a Queue with a ring (under q.mu).
func (q *Queue) ringLen() int {
	n, _ := q.ring.r.Peek()
	return int(n) + len(q.ring.front) + len(q.ring.over)
}

// ringDescribe is the status line of a Queue with a ring (under q.mu).
func (q *Queue) ringDescribe() (string, int) {
	items, bytes := q.ringDepth()
	max := "unbounded"
	if q.maxsize > 0 {
		max = fmt.Sprintf("max %d", q.maxsize)
	}
	q.ring.wmu.Lock()
	dw := q.ring.wn
	q.ring.wmu.Unlock()
	return fmt.Sprintf("%d items, %d bytes, %s, shared ring", items, bytes, max) + q.describeTasks(int64(q.ring.r.UnfinishedNow())),
		dw + q.ring.r.Waiting()
}
