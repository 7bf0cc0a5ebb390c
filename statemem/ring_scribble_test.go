package statemem

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// A client flips the head word between a valid position and a misaligned
// one at the area's end while the daemon reads the head record: every
// read takes the words it uses from one checked load, so it finds the
// record or calls the ring corrupt, and never reads past the mapping.
func TestHeadFlippedUnderTheDaemonIsReadOnce(t *testing.T) {
	r := newTestRing(t, 0)
	if r.Lock(func(uint32) bool { return false }) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(false)
	if err := r.Put(RecItem, []byte("x")); err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for range 64 {
				atomic.StoreUint64(r.word(ringOffHead), 0)
				atomic.StoreUint64(r.word(ringOffHead), r.cap-1)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		if _, _, _, err := r.Head(); err != nil && !errors.Is(err, ErrRingCorrupt) {
			t.Fatal(err)
		}
	}
}

// A client moves the tail between the daemon's Fits and its Put: Put
// checks the words it writes at again, and refuses (ErrRingCorrupt) with
// nothing written.
func TestPutChecksTheTailItWritesAt(t *testing.T) {
	r := newTestRing(t, 0)
	if r.Lock(func(uint32) bool { return false }) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(false)
	if ok, err := r.Fits(100); !ok || err != nil {
		t.Fatal(ok, err)
	}
	atomic.StoreUint64(r.word(ringOffTail), r.cap-3)
	atomic.StoreUint64(r.word(ringOffHead), r.cap-3)
	if err := r.Put(RecItem, make([]byte, 100)); !errors.Is(err, ErrRingCorrupt) {
		t.Fatalf("Put after a scribbled tail: %v", err)
	}
	if tail := atomic.LoadUint64(r.word(ringOffTail)); tail != r.cap-3 {
		t.Fatalf("the tail moved to %d", tail)
	}
}

// A slot's sleeper count and the total are data: scribbled to 2^32-1, a
// session end's ReleaseLatch takes the slot's count off the total at once
// (it used to take it off one at a time), never below zero.
func TestReleaseLatchTakesAScribbledCountOffAtOnce(t *testing.T) {
	r := newTestRing(t, 0)
	total := (*uint32)(unsafe.Pointer(&r.mem[ringOffWaiters]))
	atomic.StoreUint32(r.slotWaiters(5), 0xFFFFFFFF)
	atomic.StoreUint32(total, 0xFFFFFFFF)
	done := make(chan struct{})
	go func() { r.ReleaseLatch(5); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("ReleaseLatch of one slot still running after 1 s")
	}
	if n := atomic.LoadUint32(total); n != 0 {
		t.Fatalf("sleepers %d after the slot's were taken off", n)
	}
}

// A record a client wrote longer than the inline limit (clients never
// write one) is corruption: the daemon would hand it to a socket getter
// past what a reply may carry.
func TestRecordOverTheInlineLimitIsCorrupt(t *testing.T) {
	r := newTestRing(t, 0)
	if r.Lock(func(uint32) bool { return false }) != nil {
		t.Fatal("lock")
	}
	defer r.Unlock(false)
	n := r.Inline() + 8
	binary.LittleEndian.PutUint32(r.mem[RingHeader:], uint32(n))
	binary.LittleEndian.PutUint32(r.mem[RingHeader+4:], RecItem)
	atomic.StoreUint64(r.word(ringOffTail), (recHeader+pad8(n))|1<<ringPosBits)
	if _, _, _, err := r.Head(); !errors.Is(err, ErrRingCorrupt) {
		t.Fatalf("a record of %d bytes (inline %d): %v", n, r.Inline(), err)
	}
}
