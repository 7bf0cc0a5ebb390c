package statemem

import (
	"sync/atomic"
	"unsafe"
)

// A JoinableQueue's task counts in its ring: the done word (against the
// tail's put count) and the owed table of what each session's gets owe.

func (r *Ring) owedWord(idx uint32) *uint32 {
	return (*uint32)(unsafe.Pointer(&r.mem[ringOffOwed+4*int(idx)]))
}

// Unfinished returns a JoinableQueue ring's unfinished count: (puts -
// done) mod 2^24 (under the latch; any time for status).
func (r *Ring) Unfinished() uint64 {
	_, puts := r.tail()
	return (puts - atomic.LoadUint64(r.word(ringOffDone))) & ringCountMax
}

// AddDone adds d (mod 2^64) to the done word (under the latch): +1 marks a
// task done, -1 counts a put the daemon keeps outside the ring, +1 again
// when that item enters the ring.
func (r *Ring) AddDone(d int64) {
	atomic.StoreUint64(r.word(ringOffDone), atomic.LoadUint64(r.word(ringOffDone))+uint64(d))
}

// Owed returns owed-table entry idx (< RingSlots), SetOwed writes it (under
// the latch).
func (r *Ring) Owed(idx uint32) uint32       { return atomic.LoadUint32(r.owedWord(idx)) }
func (r *Ring) SetOwed(idx uint32, v uint32) { atomic.StoreUint32(r.owedWord(idx), v) }

// OwedNow is Owed without the latch (any time; 0 once closed): a word
// read as data, for whether an ended session owes anything at all.
func (r *Ring) OwedNow(idx uint32) uint32 {
	if !r.enter() {
		return 0
	}
	defer r.exit()
	return r.Owed(idx)
}

// UnfinishedNow is Unfinished for status (any time; 0 once closed).
func (r *Ring) UnfinishedNow() uint64 {
	if !r.enter() {
		return 0
	}
	defer r.exit()
	return r.Unfinished()
}
