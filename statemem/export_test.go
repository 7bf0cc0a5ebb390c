package statemem

import "sync/atomic"

// Test access to a ring's header, as a scribbling client has it.

// RingOffLatch and RingOffTail are the latch's and the tail word's offsets.
const (
	RingOffLatch = ringOffLatch
	RingOffTail  = ringOffTail
)

// TestSetWord stores x at byte offset off of the header, as a scribbling
// client would.
func (r *Ring) TestSetWord(off int, x uint64) {
	if off < 0 || off+8 > RingHeader || off%8 != 0 {
		panic("statemem: bad header offset")
	}
	if !r.enter() {
		return
	}
	defer r.exit()
	atomic.StoreUint64(r.word(off), x)
}

// TestWord loads the u64 at byte offset off of the header.
func (r *Ring) TestWord(off int) uint64 {
	if off < 0 || off+8 > RingHeader || off%8 != 0 {
		panic("statemem: bad header offset")
	}
	if !r.enter() {
		return 0
	}
	defer r.exit()
	return atomic.LoadUint64(r.word(off))
}
