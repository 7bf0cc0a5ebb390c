package statemem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Ring is the shared-memory storage of one Queue: a byte ring of records
// in a segment of its own (an anonymous memory file, sealed against
// shrinking and growing, passed to same-host clients over the Unix socket
// with SCM_RIGHTS). Layout (native byte order; keep in step with
// pyclient/csrc/fp_ring.h, which layout_c_test.go checks):
//
//	0    u64  RingMagic
//	8    u32  RingVersion
//	12   u32  RingHeader (the data area's offset)
//	16   u64  capacity: bytes of the data area (a power of two)
//	24   u64  maxsize: items the ring holds at most (0: no limit)
//	32   u64  inline max: the largest item a client writes into the ring
//	40   u64  journal proof: the head word (get) or done word (task_done)
//	          that the in-flight op's commit stores (JoinableQueue only)
//	48   u64  journal op: kind (bits 56-63: RingJournalGet, RingJournalDone)
//	          | owed-table index (bits 32-55) | that entry's value once the
//	          op is done (bits 0-31); 0: no journal
//	56   u64  journal holder: the session slot that wrote the journal
//	64   u64  latch: the session slot of the one op in flight (0: none)
//	72   u64  flags: RingFlagDaemon | RingFlagOver
//	80   u64  tail word: position (bits 0-39) | puts (bits 40-63)
//	88   u64  head word: position (bits 0-39) | gets (bits 40-63)
//	96   u64  seq: bumped by every change; the futex word (low 32 bits)
//	104  u32  waiters: processes asleep (or about to sleep) on seq
//	112  u64  done (JoinableQueue): tasks marked done, less the items the
//	          daemon holds outside the ring's put count (over); unfinished
//	          = (puts - done) mod 2^24
//	128  per session slot, 16 bytes: u32 its threads waiting now, u32 what
//	     for (RingWaitGet, RingWaitPut, RingWaitJoin), u64 CLOCK_MONOTONIC ns
//	     at which the first of them began (written when the count leaves 0)
//	128+16*RingSlots  owed table (JoinableQueue): per session slot, u32 the
//	     items it got and has not marked done; entry 0 counts those of
//	     sessions without a slot in the table (the daemon knows which)
//	RingHeader..  data area
//
// Positions count bytes for ever (mod 2^40); a record starts at position
// mod capacity. A record is an 8-byte header (u32 length, u32 kind) and its
// payload padded to 8 bytes; it never wraps: a pad record fills the end of
// the area instead. Items = puts - gets (mod 2^24).
//
// The capacity is large (the daemon's --queue-ring-bytes, 64 MiB by
// default, at most RingMaxCapacity) and the memory file is sparse: a page
// exists only once a record touched it. Hot window rule: a put whose write
// index is at or past RingHot, with room before the records the ring holds
// for them and its own record again (2 x (used + need) <= index: they lie
// in [index - used, index) and none wraps; always so in an empty ring past
// the window), writes a pad record there and places its record at index 0.
// The pad's bytes count as used until the readers pass it, hence the room
// for as much again: writers go on meanwhile. So a queue stays within
// RingHot plus twice what it holds (warm in the caches, few pages) instead
// of sweeping the whole area: a queue of small items in the first RingHot
// bytes, one of 1 MiB arrays a few MiB behind its consumer. Readers need nothing new: a pad record at the
// head always sends them to index 0. The daemon gives back the pages past
// the hot window of a ring that is empty and idle (Trim).
//
// Every op holds the latch (the holder's slot id) while it reads or writes
// the ring, and commits with one store: a put stores the tail word after
// the record is complete, a get stores the head word after it has copied
// the record. An op killed before its store did nothing; after it, it is
// done. Either way the ring is consistent, so the daemon repairs a dead
// session's latch by letting go of it (ReleaseLatch). On a JoinableQueue's
// ring a get (which raises its slot's owed entry) and a task_done (which
// stores done, then lowers an owed entry) change a second word after their
// commit; they write a journal first, and the daemon, taking over the
// latch of a dead holder, finishes the second store if the commit
// happened (repair).
//
// The daemon trusts nothing it reads here: it keeps the capacity and limits
// on its side and checks every position and length before it uses it.
const (
	RingMagic   uint64 = 0x5152474d434e5953 // "SYNCMGRQ" read as a little-endian u64
	RingVersion uint32 = 2
	// RingHot is the hot window: see the placement rule above.
	RingHot = 256 << 10
	// RingMaxCapacity bounds a ring's data area.
	RingMaxCapacity = 1 << 30

	// RingSlots is the number of session slots the waiter table covers:
	// sessions with a larger slot id use the queue through the daemon.
	RingSlots  = 1024
	RingHeader = ringOffOwed + 4*RingSlots

	ringOffCap     = 16
	ringOffMaxsize = 24
	ringOffInline  = 32
	ringOffJProof  = 40
	ringOffJOp     = 48
	ringOffJHolder = 56
	ringOffDone    = 112
	ringOffOwed    = ringOffSlots + 16*RingSlots
	ringOffLatch   = 64
	ringOffFlags   = 72
	ringOffTail    = 80
	ringOffHead    = 88
	ringOffSeq     = 96
	ringOffWaiters = 104
	ringOffSlots   = 128

	// What a slot's sleepers wait for.
	RingWaitGet uint32 = 1
	RingWaitPut uint32 = 2
	// RingWaitJoin: a JoinableQueue join.
	RingWaitJoin uint32 = 3

	// Journal kinds (bits 56-63 of the journal op word).
	RingJournalGet  uint64 = 1
	RingJournalDone uint64 = 2

	// RingMaxUnfinished bounds a JoinableQueue's unfinished tasks (the
	// count is kept mod 2^24): a put past it waits as on a full queue.
	RingMaxUnfinished uint64 = ringCountMax - 1

	// RingFlagDaemon: the daemon holds items of this queue before the ring
	// (an undone get's item), or the ring is retired or broken; clients
	// send every op to the daemon while it is set.
	RingFlagDaemon uint64 = 1
	// RingFlagOver: the daemon holds the newest items of this queue, after
	// everything in the ring (puts that found no room). Clients send their
	// puts to the daemon (they queue behind those items), but get from the
	// ring while it holds records; a get that finds the ring empty goes to
	// the daemon. qsize, empty and full go to the daemon while any flag is
	// set. A client that knows no finer rule treats any nonzero flags word
	// as RingFlagDaemon.
	RingFlagOver uint64 = 2

	// Record kinds.
	RecItem     uint32 = 1 // payload: the item's bytes
	RecExternal uint32 = 2 // payload: u64 id of an item the daemon keeps
	RecPad      uint32 = 3 // the rest of the area up to its end is unused

	ringPosBits         = 40
	ringPosMask  uint64 = 1<<ringPosBits - 1
	ringCountOne uint64 = 1 << ringPosBits
	ringCountMax uint64 = 1<<24 - 1
	recHeader           = 8
)

// ErrRingCorrupt: a position or length read from a ring is impossible (a
// client scribbled on it). The daemon stops using the queue.
var ErrRingCorrupt = errors.New("statemem: queue ring corrupted")

// ErrRingClosed: the ring's queue was removed.
var ErrRingClosed = errors.New("statemem: queue ring closed")

// Ring is the daemon's view of one queue's ring.
type Ring struct {
	// mu guards refs and closed: the daemon's goroutines hold a reference
	// while they touch the mapping (enter/exit), and the last one out of a
	// closed ring unmaps it.
	mu     sync.Mutex
	refs   int
	closed bool
	fdmu   sync.Mutex // fd is used (passed to a client) or closed under fdmu
	fd     int
	mem    []byte
	own    atomic.Int32 // the daemon's own sleepers in Sleep (counted in the waiters word too)
	// daemon counts the daemon's goroutines that hold the latch, or are
	// about to (around their compare-and-swap): a latch that reads
	// LatchDaemon while none does was written by a client (Lock).
	daemon  atomic.Int32
	cap     uint64 // data bytes, the daemon's own copy
	maxsize uint64
	inline  uint64
}

// RingSize returns the data capacity (a power of two of at least 4 KiB and
// at most RingMaxCapacity) for a wish of bytes.
func RingSize(bytes int64) uint64 {
	c := uint64(4096)
	for c < uint64(bytes) && c < RingMaxCapacity {
		c <<= 1
	}
	return c
}

// NewRing creates a ring of capacity data bytes (see RingSize) in a new
// sealed memory file (sealedMemory), not reserved: its data pages come into
// being as records touch them. maxsize bounds the items it holds (0: none)
// and inline the largest item clients write into it.
func NewRing(capacity, maxsize, inline uint64) (*Ring, error) {
	if !littleEndian {
		return nil, ErrBigEndian
	}
	if capacity < 4096 || capacity&(capacity-1) != 0 || capacity > RingMaxCapacity {
		return nil, fmt.Errorf("statemem: ring capacity %d is not a power of two in [4 KiB, 1 GiB]", capacity)
	}
	if inline > capacity/4 {
		inline = capacity / 4
	}
	fd, mem, err := sealedMemory("queue", int64(RingHeader)+int64(capacity), false)
	if err != nil {
		return nil, err
	}
	r := &Ring{fd: fd, mem: mem, cap: capacity, maxsize: maxsize, inline: inline}
	binary.LittleEndian.PutUint32(mem[8:], RingVersion)
	binary.LittleEndian.PutUint32(mem[12:], RingHeader)
	binary.LittleEndian.PutUint64(mem[ringOffCap:], capacity)
	binary.LittleEndian.PutUint64(mem[ringOffMaxsize:], maxsize)
	binary.LittleEndian.PutUint64(mem[ringOffInline:], inline)
	atomic.StoreUint64(r.word(0), RingMagic)
	return r, nil
}

// WithFD calls fn with the memory file's descriptor (to pass it to a
// client), unless the ring is closed (ErrRingClosed).
func (r *Ring) WithFD(fn func(fd int) error) error {
	r.fdmu.Lock()
	defer r.fdmu.Unlock()
	if r.fd < 0 {
		return ErrRingClosed
	}
	return fn(r.fd)
}

// Size returns the segment's size in bytes.
func (r *Ring) Size() int64 { return int64(RingHeader) + int64(r.cap) }

// Capacity returns the data area's size.
func (r *Ring) Capacity() uint64 { return r.cap }

// Inline returns the largest item clients write into the ring.
func (r *Ring) Inline() uint64 { return r.inline }

// Maxsize returns the items the ring holds at most (0: no limit), as the
// daemon keeps it (clients get it from queue_attach's reply).
func (r *Ring) Maxsize() uint64 { return r.maxsize }

// Close retires the ring: its daemon flag is set and its sleepers woken (a
// client that still maps it goes to the daemon, which no longer knows the
// queue), its file is closed, and the daemon's mapping goes once no
// goroutine uses it. Clients' maps stay valid until they unmap.
func (r *Ring) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	atomic.StoreUint64(r.word(ringOffFlags), RingFlagDaemon)
	atomic.AddUint64(r.word(ringOffSeq), 1)
	WakeAll(r.word(ringOffSeq))
	unmap := r.refs == 0
	r.mu.Unlock()
	r.fdmu.Lock()
	err := unix.Close(r.fd)
	r.fd = -1
	r.fdmu.Unlock()
	if unmap {
		r.unmap()
	}
	return err
}

// enter takes a reference on the mapping; false: the ring is closed.
func (r *Ring) enter() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.refs++
	return true
}

// exit drops a reference; the last one out of a closed ring unmaps it.
func (r *Ring) exit() {
	r.mu.Lock()
	r.refs--
	unmap := r.closed && r.refs == 0
	r.mu.Unlock()
	if unmap {
		r.unmap()
	}
}

func (r *Ring) unmap() {
	r.mu.Lock()
	mem := r.mem
	r.mem = nil
	r.mu.Unlock()
	if mem != nil {
		_ = unix.Munmap(mem)
	}
}

func (r *Ring) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }

// slotWaiters returns slot's entry in the waiter table (slot < RingSlots).
func (r *Ring) slotWaiters(slot uint32) *uint32 {
	return (*uint32)(unsafe.Pointer(&r.mem[ringOffSlots+16*slot]))
}

// RingWaiter is one session slot's sleepers on a ring.
type RingWaiter struct {
	Slot  uint32
	Count int
	Op    uint32    // RingWaitGet or RingWaitPut (anything else: unknown)
	Since time.Time // zero: unknown
}

// Waiters lists the slots with sleepers now (for status).
func (r *Ring) Waiters() []RingWaiter {
	if !r.enter() {
		return nil
	}
	defer r.exit()
	var out []RingWaiter
	for i := uint32(1); i < RingSlots; i++ {
		n := atomic.LoadUint32(r.slotWaiters(i))
		if n == 0 {
			continue
		}
		e := ringOffSlots + 16*int(i)
		w := RingWaiter{Slot: i, Count: int(n), Op: atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.mem[e+4])))}
		if t, ok := SinceTime(atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.mem[e+8])))); ok {
			w.Since = t
		}
		out = append(out, w)
	}
	return out
}

// Waiting returns how many threads of clients sleep on the ring now, as
// the per-slot table counts them.
func (r *Ring) Waiting() int {
	if !r.enter() {
		return 0
	}
	defer r.exit()
	n := 0
	for i := uint32(0); i < RingSlots; i++ {
		n += int(atomic.LoadUint32(r.slotWaiters(i)))
	}
	return n
}

// Seq returns the change counter (the futex word's value).
func (r *Ring) Seq() uint32 {
	if !r.enter() {
		return 0
	}
	defer r.exit()
	return r.seq()
}

func (r *Ring) seq() uint32 { return uint32(atomic.LoadUint64(r.word(ringOffSeq))) }

// Sleep waits for seq to change from seen, for at most d, counting itself
// as a waiter so that changers wake it.
func (r *Ring) Sleep(seen uint32, d time.Duration) {
	if !r.enter() {
		return
	}
	defer r.exit()
	wp := (*uint32)(unsafe.Pointer(&r.mem[ringOffWaiters]))
	// own never counts a sleeper the waiters word does not (raised after it,
	// lowered before it), so waiters > own whenever a client sleeps.
	atomic.AddUint32(wp, 1)
	r.own.Add(1)
	futexWaitWord(r.word(ringOffSeq), seen, d)
	r.own.Add(-1)
	atomic.AddUint32(wp, ^uint32(0))
}

// Flags returns the flags word; SetFlags writes it (under the latch).
// Len, Fits, Put, Get and SetFlags are for the holder of the latch only.
func (r *Ring) Flags() uint64 {
	if !r.enter() {
		return RingFlagDaemon
	}
	defer r.exit()
	return atomic.LoadUint64(r.word(ringOffFlags))
}
func (r *Ring) SetFlags(f uint64)      { atomic.StoreUint64(r.word(ringOffFlags), f) }
func (r *Ring) tail() (uint64, uint64) { return split(atomic.LoadUint64(r.word(ringOffTail))) }
func (r *Ring) head() (uint64, uint64) { return split(atomic.LoadUint64(r.word(ringOffHead))) }

func split(x uint64) (pos, n uint64) { return x & ringPosMask, x >> ringPosBits }

// join is split's inverse: a tail or head word of position pos and count
// n, each taken modulo its field.
func join(pos, n uint64) uint64 { return pos&ringPosMask | (n&ringCountMax)<<ringPosBits }

// Len returns the items and bytes in the ring, checked (under the latch).
func (r *Ring) Len() (items, bytes uint64, err error) {
	e := r.ends()
	return e.items, e.used, e.err
}

// ringEnds is one reading of a ring's tail and head words, checked: every
// op takes the words it uses from one such reading, since a client may
// change them between two loads (a scribble: clients change them only
// under the latch).
type ringEnds struct {
	tp, tn, hp, hn uint64
	items, used    uint64
	err            error // ErrRingCorrupt: the words do not describe a ring
}

// ends reads the tail and head words once and checks them: aligned
// positions, no more bytes used than the ring has, and no more items than
// those bytes hold. An index taken from a checked position (pos &
// (cap-1)) leaves room for a record header.
func (r *Ring) ends() ringEnds {
	var e ringEnds
	e.tp, e.tn = r.tail()
	e.hp, e.hn = r.head()
	e.used = (e.tp - e.hp) & ringPosMask
	e.items = (e.tn - e.hn) & ringCountMax
	if e.used > r.cap || e.items > e.used/recHeader || e.tp%recHeader != 0 || e.hp%recHeader != 0 {
		e = ringEnds{err: ErrRingCorrupt}
	}
	return e
}

// Peek returns the Len without the checks, for status (any time; zeros
// once the ring is closed).
func (r *Ring) Peek() (items, bytes uint64) {
	if !r.enter() {
		return 0, 0
	}
	defer r.exit()
	tp, tn := r.tail()
	hp, hn := r.head()
	return (tn - hn) & ringCountMax, (tp - hp) & ringPosMask
}

func pad8(n uint64) uint64 { return (n + 7) &^ 7 }

// Fits reports whether a record with n payload bytes fits now, given the
// ring's maxsize (under the latch).
func (r *Ring) Fits(n uint64) (bool, error) {
	e := r.ends()
	if e.err != nil {
		return false, e.err
	}
	return r.roomAt(e, n), nil
}

// roomAt reports whether a record with n payload bytes fits after e's
// tail, given the ring's maxsize.
func (r *Ring) roomAt(e ringEnds, n uint64) bool {
	return (r.maxsize == 0 || e.items < r.maxsize) && r.fitsAt(e, n)
}

// fitsAt reports whether a record with n payload bytes fits after e's tail
// (with a pad record to the end when it does not fit before it).
func (r *Ring) fitsAt(e ringEnds, n uint64) bool {
	idx := e.tp & (r.cap - 1)
	need := recHeader + pad8(n)
	if idx+need > r.cap {
		need += r.cap - idx
	}
	return e.used+need <= r.cap
}

// Put appends a record of kind with payload p; the caller checked Fits
// (under the latch). A put into an empty ring past the hot window starts
// again at index 0 (see the layout above). The words are read and checked
// again: ErrRingCorrupt when a client changed them since Fits so that the
// record no longer fits, and nothing is written.
func (r *Ring) Put(kind uint32, p []byte) error {
	e := r.ends()
	if e.err != nil || !r.fitsAt(e, uint64(len(p))) {
		return ErrRingCorrupt
	}
	r.write(&e, kind, p)
	r.publish(e)
	return nil
}

// PutMany appends records of kind with the payloads of ps, from the first
// and as many as fit (each checked as Fits checks one, the ring's maxsize
// included), and publishes them with one store of the tail word: a reader
// sees all of them or none, and the words are read once for the batch, not
// twice per record. It returns how many it wrote (under the latch).
func (r *Ring) PutMany(kind uint32, ps [][]byte) (int, error) {
	e := r.ends()
	if e.err != nil {
		return 0, e.err
	}
	n := 0
	for _, p := range ps {
		if !r.roomAt(e, uint64(len(p))) {
			break
		}
		r.write(&e, kind, p)
		n++
	}
	if n > 0 {
		r.publish(e)
	}
	return n, nil
}

// write puts a record of kind with payload p after e's tail, which fitsAt
// checked, and moves e past it; the tail word is not written (publish).
func (r *Ring) write(e *ringEnds, kind uint32, p []byte) {
	idx := e.tp & (r.cap - 1)
	need := recHeader + pad8(uint64(len(p)))
	adv := need
	if idx+need > r.cap || idx >= RingHot && 2*(e.used+need) <= idx {
		r.header(idx, 0, RecPad)
		adv += r.cap - idx
		idx = 0
	}
	r.header(idx, uint32(len(p)), kind)
	copy(r.mem[RingHeader+idx+recHeader:], p)
	e.tp = (e.tp + adv) & ringPosMask
	e.tn = (e.tn + 1) & ringCountMax
	e.used += adv
	e.items++
}

// publish stores e's tail: the records written since it was read are
// the ring's.
func (r *Ring) publish(e ringEnds) {
	atomic.StoreUint64(r.word(ringOffTail), join(e.tp, e.tn))
}

func (r *Ring) header(idx uint64, n, kind uint32) {
	b := r.mem[RingHeader+idx:]
	binary.LittleEndian.PutUint32(b, n)
	binary.LittleEndian.PutUint32(b[4:], kind)
}

// Get removes the head record and returns its kind and a copy of its
// payload; ok is false when the ring is empty (under the latch).
func (r *Ring) Get() (kind uint32, p []byte, ok bool, err error) {
	h, ok, err := r.headRecord()
	if !ok {
		return 0, nil, false, err
	}
	p = make([]byte, h.n)
	copy(p, r.payload(h))
	atomic.StoreUint64(r.word(ringOffHead), join(h.hp+h.adv, h.hn+1))
	return h.kind, p, true, nil
}

// GetMany removes item records from the head, in order, and returns
// copies of their payloads: at most max, stopping before a record that is
// not an item (an external one, which the caller takes alone), before one
// whose payload and framing would take used past budget, and when the ring
// is empty. The words are read once and the head word is stored once, and
// the copies of up to getChunk records share one allocation (each item
// capped at its own length). A record that does not check out ends the
// batch before it; it is the error only when it is the first (under the
// latch).
func (r *Ring) GetMany(max int, budget, framing int64) (items [][]byte, used int64, err error) {
	e := r.ends()
	if e.err != nil {
		return nil, 0, e.err
	}
	var recs [getChunk]record
	for more := true; more; {
		k, total := 0, uint64(0)
		for more = false; len(items)+k < max && e.items > 0; {
			if k == len(recs) {
				more = true
				break
			}
			h, rerr := r.recordAt(e.hp, e.hn, e.used)
			if rerr != nil && len(items)+k == 0 {
				return nil, 0, rerr
			}
			if rerr != nil || h.kind != RecItem || int64(h.n)+framing > budget-used {
				break
			}
			recs[k] = h
			k++
			total += uint64(h.n)
			used += int64(h.n) + framing
			e.hp = (e.hp + h.adv) & ringPosMask
			e.hn = (e.hn + 1) & ringCountMax
			e.used -= h.adv
			e.items--
		}
		buf := make([]byte, total)
		for _, h := range recs[:k] {
			n := copy(buf, r.payload(h))
			items = append(items, buf[:n:n])
			buf = buf[n:]
		}
	}
	if len(items) > 0 {
		atomic.StoreUint64(r.word(ringOffHead), join(e.hp, e.hn))
	}
	return items, used, nil
}

// getChunk is how many records' copies GetMany makes in one allocation.
const getChunk = 64

// Head returns the head record's kind and a view of its payload without
// removing it (under the latch; the view is valid until the latch is let
// go, and is data, as every word read from the ring).
func (r *Ring) Head() (kind uint32, p []byte, ok bool, err error) {
	h, ok, err := r.headRecord()
	if !ok {
		return 0, nil, false, err
	}
	return h.kind, r.payload(h), true, nil
}

// payload is a view of h's payload in the ring's memory.
func (r *Ring) payload(h record) []byte {
	start := RingHeader + h.idx + recHeader
	return r.mem[start : start+uint64(h.n) : start+uint64(h.n)]
}

// record is where the head record lies: the head word it was found from
// (position and count), its payload's index and length, its kind, and how
// far the head moves past it (with a pad record before it).
type record struct {
	hp, hn, idx, adv uint64
	n, kind          uint32
}

// headRecord finds the head record, following a pad, and checks that it
// lies within the ring and the used bytes; ok is false when the ring is
// empty or corrupt (err says which).
func (r *Ring) headRecord() (h record, ok bool, err error) {
	e := r.ends()
	if e.err != nil || e.items == 0 {
		return h, false, e.err
	}
	if h, err = r.recordAt(e.hp, e.hn, e.used); err != nil {
		return h, false, err
	}
	return h, true, nil
}

// recordAt finds the record at head position hp (count hn), following a
// pad, and checks that it lies within the ring and the used bytes.
func (r *Ring) recordAt(hp, hn, used uint64) (record, error) {
	var h record
	idx := hp & (r.cap - 1)
	adv := uint64(0)
	n, kind := r.readHeader(idx)
	if kind == RecPad {
		adv = r.cap - idx
		idx = 0
		n, kind = r.readHeader(idx)
	}
	// An item is never longer than the inline limit (the daemon's own
	// copy): a longer one would go out to a socket getter past what a
	// reply may carry.
	if kind != RecItem && kind != RecExternal || uint64(n) > r.cap-idx-recHeader || kind == RecItem && uint64(n) > r.inline {
		return h, ErrRingCorrupt
	}
	adv += recHeader + pad8(uint64(n))
	if adv > used || kind == RecExternal && n != 8 {
		return h, ErrRingCorrupt
	}
	return record{hp: hp, hn: hn, idx: idx, adv: adv, n: n, kind: kind}, nil
}

// readHeader reads the record header at idx, which a checked position
// gave (ends): aligned, so within the ring with its header.
func (r *Ring) readHeader(idx uint64) (uint32, uint32) {
	b := r.mem[RingHeader+idx : RingHeader+idx+recHeader]
	return binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
}

// Trim gives back the data pages past the hot window (punches them out of
// the memory file) when the ring is empty and its seq is still idle (the
// value a previous look saw: nothing changed since). It takes the latch
// only if it is free, never waiting on a client, and reports the seq it
// saw (for the next look) and whether it punched. Pages a later record
// touches come back as zeros.
func (r *Ring) Trim(idle uint32) (seq uint32, punched bool, err error) {
	if !r.enter() {
		return 0, false, nil
	}
	defer r.exit()
	seq = r.seq()
	if seq != idle {
		return seq, false, nil
	}
	if !r.claim(0) {
		return seq, false, nil
	}
	defer r.release()
	tp, _ := r.tail()
	hp, _ := r.head()
	if tp != hp || r.cap <= RingHot {
		return seq, false, nil
	}
	page := int64(unix.Getpagesize())
	from := (int64(RingHeader) + RingHot + page - 1) / page * page
	end := r.Size()
	r.fdmu.Lock()
	defer r.fdmu.Unlock()
	if r.fd < 0 || from >= end {
		return seq, false, nil
	}
	// Nothing allocated past the window: nothing to do (tmpfs answers
	// SEEK_DATA from its page cache).
	if _, err := unix.Seek(r.fd, from, unix.SEEK_DATA); err == unix.ENXIO {
		return seq, false, nil
	}
	if err := unix.Fallocate(r.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, from, end-from); err != nil {
		return seq, false, err
	}
	return seq, true, nil
}

// Allocated returns the bytes of memory the ring's file holds now (its
// allocated blocks), for status and tests.
func (r *Ring) Allocated() int64 {
	var st unix.Stat_t
	err := r.WithFD(func(fd int) error { return unix.Fstat(fd, &st) })
	if err != nil {
		return 0
	}
	return st.Blocks * 512
}
