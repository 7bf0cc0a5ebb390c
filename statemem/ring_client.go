package statemem

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A ClientRing is a same-host client's mapping of a Queue's ring (layout:
// Ring). It follows the protocol of pyclient/csrc/fp_ring.c step for step,
// so Go and Python clients and the daemon share one FIFO:
//
//   - every op takes the latch (a CAS of the client's session slot id into
//     the latch word), waiting for another holder at most LatchGrace;
//   - a nonzero flags word (for a get: any flag but RingFlagOver, or
//     RingFlagOver with the ring empty), a latch held longer, an item over
//     the inline maximum, a record the daemon keeps (RecExternal), no room left in the
//     ring, or anything impossible read from it answers Daemon: the caller
//     sends the op over the socket (the daemon finds any damage and fails
//     the queue);
//   - a put writes its record (a pad record first when it does not fit
//     before the end of the data area) and commits with one store of the
//     tail word; a get copies the head record out, hands it to the caller,
//     and commits with one store of the head word only if the caller took
//     it; both commit only while the latch is still the client's (the
//     daemon takes over the latch of a session that ended);
//   - a change bumps seq and wakes its sleepers; a blocking op registers as
//     a waiter (the waiters word and the slot's entry) under the latch and
//     sleeps on seq with a futex;
//   - on a JoinableQueue's ring (queue_attach's reply said joinable) the
//     task counts are in the ring too: a get writes a journal (the head
//     word it commits, the client's owed entry after it), commits the
//     head, raises its own owed entry and clears the journal; TaskDone
//     journals, commits done+1, lowers an owed entry (its own if it owes,
//     else the first that does) and clears the journal; Join sleeps on seq
//     until unfinished = (puts - done) mod 2^24 is 0; a put waits as on a
//     full queue once unfinished would reach RingMaxUnfinished. The daemon
//     finishes the journal of a client that died between its commit and
//     the owed store (Ring.repair).
//
// Nothing read from the ring is trusted: every position and length is
// checked against the capacity the daemon's reply gave, and maxsize comes
// from the reply too.
type ClientRing struct {
	mem     []byte
	cap     uint64
	inline  uint64
	maxsize uint64
	slot    uint64
	// joinable: a JoinableQueue's ring (from queue_attach's reply): gets
	// record their debts and puts respect RingMaxUnfinished.
	joinable bool
}

// OpenRing maps the ring behind fd (passed by queue_attach) with the
// layout queue_attach's reply announced; slot is the client's session slot
// id, joinable the reply's joinable (a JoinableQueue's ring: the slot must
// have an owed entry, below RingSlots). The mapping lasts while the
// ClientRing is reachable. The file is checked as OpenFD checks the state
// segment (this user's, mode 0600, of exactly size bytes, sealed against
// resizing) and its header must match the reply. fd is not kept: the
// caller closes it.
func OpenRing(fd int, size int64, capacity, inline, maxsize uint64, slot uint32, joinable bool) (*ClientRing, error) {
	if !littleEndian {
		return nil, ErrBigEndian
	}
	if capacity < 4096 || capacity&(capacity-1) != 0 || capacity > RingMaxCapacity || size != int64(RingHeader)+int64(capacity) ||
		inline > capacity/4 || slot == 0 || slot > MaxSlot || joinable && slot >= RingSlots {
		return nil, fmt.Errorf("%w: bad ring layout (size %d, capacity %d, inline %d, slot %d)", ErrBadSegment, size, capacity, inline, slot)
	}
	if err := checkFD(fd, size); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("statemem: map ring: %w", err)
	}
	if atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[0]))) != RingMagic ||
		binary.LittleEndian.Uint32(mem[8:]) != RingVersion || binary.LittleEndian.Uint32(mem[12:]) != RingHeader ||
		atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[ringOffCap]))) != capacity {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("%w: not a queue ring (bad header)", ErrBadSegment)
	}
	r := &ClientRing{mem: mem, cap: capacity, inline: inline, maxsize: maxsize, slot: uint64(slot), joinable: joinable}
	// Unmapped once no op can reach it (every op keeps r alive until it
	// last touches the mapping).
	runtime.AddCleanup(r, func(mem []byte) { _ = unix.Munmap(mem) }, mem)
	return r, nil
}

// Inline returns the largest item the client writes into the ring.
func (r *ClientRing) Inline() uint64 { return r.inline }

// Maxsize returns the items the ring holds at most (0: no limit).
func (r *ClientRing) Maxsize() uint64 { return r.maxsize }

// Joinable reports whether the ring keeps a JoinableQueue's task counts.
func (r *ClientRing) Joinable() bool { return r.joinable }

func (r *ClientRing) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *ClientRing) u32(off int) *uint32  { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

// latchTake takes the latch; false: another holder kept it longer than
// LatchGrace (the op goes to the daemon, which judges the holder).
func (r *ClientRing) latchTake() bool {
	l := r.word(ringOffLatch)
	var since time.Time
	for i := 0; ; i++ {
		if atomic.LoadUint64(l) == 0 && atomic.CompareAndSwapUint64(l, 0, r.slot) {
			return true
		}
		switch {
		case i < 64:
		case i < 128:
			runtime.Gosched()
		default:
			now := time.Now()
			if since.IsZero() {
				since = now
			} else if now.Sub(since) >= LatchGrace {
				return false
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// latchOurs: the latch is still ours (not taken over by the daemon after
// our session ended under us).
func (r *ClientRing) latchOurs() bool { return atomic.LoadUint64(r.word(ringOffLatch)) == r.slot }

// latchFree lets go of the latch if it is still ours; changed: bump seq
// and wake the sleepers.
func (r *ClientRing) latchFree(changed bool) {
	if changed {
		atomic.AddUint64(r.word(ringOffSeq), 1)
	}
	atomic.CompareAndSwapUint64(r.word(ringOffLatch), r.slot, 0)
	if changed && atomic.LoadUint32(r.u32(ringOffWaiters)) != 0 {
		WakeAll(r.word(ringOffSeq))
	}
}

// begin takes the latch and checks the flags: false means Daemon (the
// latch is not held then). Any nonzero flags word sends the op to the
// daemon, whatever its bits mean.
func (r *ClientRing) begin() bool {
	ok, _ := r.beginFor(false)
	return ok
}

// beginFor is begin for a get (get true) or any other op. A get goes to the
// daemon only for a flag other than RingFlagOver (the daemon holds items
// before the ring's); with RingFlagOver alone (it holds the newest items)
// it takes from the ring while the ring holds records, and over tells it
// to go to the daemon once the ring is empty. The flags change only under
// the latch, so they hold for the whole op.
func (r *ClientRing) beginFor(get bool) (ok, over bool) {
	if !r.latchTake() {
		return false, false
	}
	allowed := uint64(0)
	if get {
		allowed = RingFlagOver
	}
	f := atomic.LoadUint64(r.word(ringOffFlags))
	if f&^allowed != 0 {
		r.latchFree(false)
		return false, false
	}
	return true, f&RingFlagOver != 0
}

// lenChecked returns the items and used bytes for the tail word t and head
// word h; ok is false when they are impossible.
func (r *ClientRing) lenChecked(t, h uint64) (items, used uint64, ok bool) {
	tp, hp := t&ringPosMask, h&ringPosMask
	used = (tp - hp) & ringPosMask
	items = (t>>ringPosBits - h>>ringPosBits) & ringCountMax
	ok = used <= r.cap && items <= used/recHeader && tp%recHeader == 0 && hp%recHeader == 0
	return items, used, ok
}

// fit: 1 a record of n payload bytes fits, 0 the queue is at its maxsize,
// 2 no room in the ring (the daemon keeps what comes next), -1 corrupt.
func (r *ClientRing) fit(n uint64) int {
	t := atomic.LoadUint64(r.word(ringOffTail))
	items, used, ok := r.lenChecked(t, atomic.LoadUint64(r.word(ringOffHead)))
	if !ok {
		return -1
	}
	if r.maxsize > 0 && items >= r.maxsize {
		return 0
	}
	if r.joinable && r.unfinished(t) >= RingMaxUnfinished {
		return 0
	}
	idx := t & ringPosMask & (r.cap - 1)
	need := recHeader + pad8(n)
	if idx+need > r.cap {
		need += r.cap - idx
	}
	if used+need > r.cap {
		return 2
	}
	return 1
}

func (r *ClientRing) header(idx uint64, n, kind uint32) {
	b := r.mem[RingHeader+idx:]
	binary.LittleEndian.PutUint32(b, n)
	binary.LittleEndian.PutUint32(b[4:], kind)
}

// write writes a record of p (it fits) and returns the tail word that
// commits it.
func (r *ClientRing) write(t uint64, p []byte) uint64 {
	tp, tn := t&ringPosMask, t>>ringPosBits
	idx := tp & (r.cap - 1)
	need := recHeader + pad8(uint64(len(p)))
	adv := need
	if idx+need > r.cap {
		r.header(idx, 0, RecPad)
		adv += r.cap - idx
		idx = 0
	}
	r.header(idx, uint32(len(p)), RecItem)
	copy(r.mem[RingHeader+idx+recHeader:RingHeader+idx+recHeader+uint64(len(p))], p)
	return join(tp+adv, tn+1)
}

// Put appends p as one item. It waits for room at most d (0: not at all),
// registered as a waiter and asleep on seq. OK: stored; Busy: no room
// (full at the deadline: nothing stored); Daemon: send the op to the
// daemon (nothing stored).
func (r *ClientRing) Put(p []byte, d time.Duration) Result {
	if uint64(len(p)) > r.inline {
		return Daemon
	}
	var deadline time.Time
	for {
		if !r.begin() {
			return Daemon
		}
		step(1)
		switch r.fit(uint64(len(p))) {
		case 1:
			t := r.write(atomic.LoadUint64(r.word(ringOffTail)), p)
			step(2)
			if !r.latchOurs() {
				return Daemon // taken over: nothing committed
			}
			atomic.StoreUint64(r.word(ringOffTail), t)
			step(3)
			r.latchFree(true)
			return OK
		case 0:
		default: // corrupt, or an item for the daemon to keep
			r.latchFree(false)
			return Daemon
		}
		if !r.sleep(RingWaitPut, d, &deadline) {
			return Busy
		}
	}
}

// peek reads the head record for the head word h: its payload (a view of
// the ring) and the head word past it. It answers OK, Busy (empty) or
// Daemon (a record the daemon keeps, or damage).
func (r *ClientRing) peek(h uint64) (p []byte, next uint64, res Result) {
	items, used, ok := r.lenChecked(atomic.LoadUint64(r.word(ringOffTail)), h)
	if !ok {
		return nil, 0, Daemon
	}
	if items == 0 {
		return nil, 0, Busy
	}
	hp, hn := h&ringPosMask, h>>ringPosBits
	idx := hp & (r.cap - 1)
	adv := uint64(0)
	n, kind := r.readHeader(idx)
	if kind == RecPad {
		adv = r.cap - idx
		idx = 0
		n, kind = r.readHeader(idx)
	}
	if kind != RecItem || uint64(n) > r.cap-idx-recHeader {
		return nil, 0, Daemon // the daemon's record, or damage the daemon will report
	}
	adv += recHeader + pad8(uint64(n))
	if adv > used {
		return nil, 0, Daemon
	}
	start := RingHeader + idx + recHeader
	return r.mem[start : start+uint64(n)], join(hp+adv, hn+1), OK
}

func (r *ClientRing) readHeader(idx uint64) (uint32, uint32) {
	b := r.mem[RingHeader+idx : RingHeader+idx+recHeader]
	return binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
}

// Get removes the head item, waiting for one at most d (0: not at all). It
// hands take a private copy of the item's bytes before it commits; when
// take fails, nothing is taken (the item stays at the head) and its error
// is returned. OK: taken; Busy: empty (at the deadline); Daemon: send the
// op to the daemon (nothing taken).
func (r *ClientRing) Get(d time.Duration, take func(p []byte) error) (Result, error) {
	var deadline time.Time
	for {
		ok, over := r.beginFor(true)
		if !ok {
			return Daemon, nil
		}
		step(11)
		p, next, res := r.peek(atomic.LoadUint64(r.word(ringOffHead)))
		switch res {
		case OK:
			item := append([]byte(nil), p...)
			if err := take(item); err != nil {
				r.latchFree(false)
				return Busy, err
			}
			step(12)
			if r.joinable {
				r.journal(RingJournalGet, next, r.slot, atomic.LoadUint32(r.owed(r.slot))+1)
			}
			if !r.latchOurs() {
				return Daemon, nil // taken over: the item stays at the head
			}
			atomic.StoreUint64(r.word(ringOffHead), next)
			step(13)
			if r.joinable {
				o := r.owed(r.slot)
				atomic.StoreUint32(o, atomic.LoadUint32(o)+1)
				atomic.StoreUint64(r.word(ringOffJOp), 0)
			}
			r.latchFree(true)
			return OK, nil
		case Daemon:
			r.latchFree(false)
			return Daemon, nil
		}
		if over { // the ring ran dry: the next items are the daemon's
			r.latchFree(false)
			return Daemon, nil
		}
		if !r.sleep(RingWaitGet, d, &deadline) {
			return Busy, nil
		}
	}
}

// sleep registers as a waiter for op under the latch, lets go of it and
// sleeps on seq until it changes or the op's deadline: d from its first
// sleep, kept in *deadline across the op's tries. It reports false when d
// is 0 or the deadline has passed (it did not sleep; the latch is let go).
func (r *ClientRing) sleep(op uint32, d time.Duration, deadline *time.Time) bool {
	if d <= 0 {
		r.latchFree(false)
		return false
	}
	if deadline.IsZero() {
		*deadline = time.Now().Add(d) // at the first sleep of the op: d counts from there
	}
	left := time.Until(*deadline)
	if left <= 0 {
		r.latchFree(false)
		return false
	}
	wp := r.u32(ringOffWaiters)
	atomic.AddUint32(wp, 1)
	var mine *uint32
	if r.slot < RingSlots {
		e := ringOffSlots + 16*int(r.slot)
		mine = r.u32(e)
		if atomic.LoadUint32(mine) == 0 {
			atomic.StoreUint32(r.u32(e+4), op)
			atomic.StoreUint64(r.word(e+8), MonoNow())
		}
		atomic.AddUint32(mine, 1)
	}
	seen := uint32(atomic.LoadUint64(r.word(ringOffSeq)))
	r.latchFree(false)
	futexWaitWord(r.word(ringOffSeq), seen, left)
	// The table's count first, the total last: a death between the two
	// leaves the total too high (a wasted wake), never too low.
	if mine != nil {
		decFloor(mine)
	}
	step(21)
	decFloor(wp)
	runtime.KeepAlive(r) // the mapping stays while wp and mine are used
	return true
}

// decFloor takes one off a count the daemon may have zeroed meanwhile (it
// forgets a session's sleepers when the session ends).
func decFloor(p *uint32) {
	for {
		x := atomic.LoadUint32(p)
		if x == 0 || atomic.CompareAndSwapUint32(p, x, x-1) {
			return
		}
	}
}

// Len returns the items in the ring; ok is false when the daemon holds
// items too (any flag set) or the counts are impossible: ask the daemon.
func (r *ClientRing) Len() (n int, ok bool) {
	if atomic.LoadUint64(r.word(ringOffFlags)) != 0 {
		return 0, false
	}
	t, h := atomic.LoadUint64(r.word(ringOffTail)), atomic.LoadUint64(r.word(ringOffHead))
	items := (t>>ringPosBits - h>>ringPosBits) & ringCountMax
	if items > r.cap/recHeader {
		return 0, false
	}
	return int(items), true
}

// unfinished is a JoinableQueue's unfinished tasks given the tail word t:
// puts less the done word, mod 2^24 (the daemon lowers done by one for
// each put it keeps outside the ring, so this counts those too). Under the
// latch.
func (r *ClientRing) unfinished(t uint64) uint64 {
	return (t>>ringPosBits - atomic.LoadUint64(r.word(ringOffDone))) & ringCountMax
}

// owed is owed-table entry idx (< RingSlots): the items that slot got and
// has not marked done.
func (r *ClientRing) owed(idx uint64) *uint32 { return r.u32(ringOffOwed + 4*int(idx)) }

// journal writes the journal of a JoinableQueue op about to commit: the
// commit stores proof (the head word for a get, the done word for a
// task_done); once committed, owed entry idx is to become after. The
// daemon, taking over the latch of a holder that died, finishes that
// second store if the commit happened (Ring.repair). The op word goes
// last: it makes the journal valid.
func (r *ClientRing) journal(kind, proof, idx uint64, after uint32) {
	atomic.StoreUint64(r.word(ringOffJProof), proof)
	atomic.StoreUint64(r.word(ringOffJHolder), r.slot)
	atomic.StoreUint64(r.word(ringOffJOp), kind<<56|idx<<32|uint64(after))
}

// TaskDone marks one task of a JoinableQueue done: under the latch the done
// word goes up by one (the commit), then one debt is paid: the client's own
// owed entry if it owes anything, else the first entry that does (an item
// got by one process and finished by another). OK: done; Busy: nothing is
// unfinished (called too many times: nothing stored); Daemon: send it to
// the daemon (nothing stored; also on a ring that is not joinable).
func (r *ClientRing) TaskDone() Result {
	if !r.joinable {
		return Daemon
	}
	if !r.begin() {
		return Daemon
	}
	step(31)
	if r.unfinished(atomic.LoadUint64(r.word(ringOffTail))) == 0 {
		r.latchFree(false)
		return Busy
	}
	idx := r.slot
	if atomic.LoadUint32(r.owed(idx)) == 0 {
		idx = RingSlots // none owes: the done word alone
		for i := uint64(0); i < RingSlots; i++ {
			if atomic.LoadUint32(r.owed(i)) != 0 {
				idx = i
				break
			}
		}
	}
	done := atomic.LoadUint64(r.word(ringOffDone)) + 1
	if idx < RingSlots {
		r.journal(RingJournalDone, done, idx, atomic.LoadUint32(r.owed(idx))-1)
	}
	step(32)
	if !r.latchOurs() {
		return Daemon // taken over: nothing committed
	}
	atomic.StoreUint64(r.word(ringOffDone), done)
	step(33)
	if idx < RingSlots {
		o := r.owed(idx)
		atomic.StoreUint32(o, atomic.LoadUint32(o)-1)
		atomic.StoreUint64(r.word(ringOffJOp), 0)
	}
	r.latchFree(true)
	return OK
}

// Join waits at most d (0: not at all) until a JoinableQueue has no
// unfinished task, registered as a waiter (RingWaitJoin) and asleep on seq,
// which every task_done bumps. OK: none unfinished; Busy: some still at the
// deadline; Daemon: ask the daemon (also on a ring that is not joinable).
// It takes nothing, however it ends.
func (r *ClientRing) Join(d time.Duration) Result {
	if !r.joinable {
		return Daemon
	}
	var deadline time.Time
	for {
		if !r.begin() {
			return Daemon
		}
		if r.unfinished(atomic.LoadUint64(r.word(ringOffTail))) == 0 {
			r.latchFree(false)
			return OK
		}
		if !r.sleep(RingWaitJoin, d, &deadline) {
			return Busy
		}
	}
}
