package manager

import (
	"sync"

	"github.com/syncmgr/syncmgr/statemem"
)

// Slot is a session's compact id: a small integer that state words (see
// state.go) store as an owner. 0 means "nobody". A slot is reused only
// after its session has ended and every pin on it (see Slots.Pin) has been
// dropped, so a word that still names a slot never names a newer session.
type Slot uint32

// MaxSlot is the largest slot id (owner fields are 29 bits wide, so that a
// word's owner, flags and futex value share its low 32 bits).
const MaxSlot = Slot(statemem.MaxSlot)

// Slots allocates slot ids: the lowest free id first, so ids stay small.
type Slots struct {
	mu   sync.Mutex
	next Slot         // the lowest id never handed out
	free []Slot       // ids handed out and returned, reused lowest first
	pins map[Slot]int // ids in use: pins held (the session's own counts as one)
}

// NewSlots returns an empty allocator.
func NewSlots() *Slots { return &Slots{next: 1, pins: make(map[Slot]int)} }

// alloc returns a free slot holding one pin, or ok false when all are used.
func (a *Slots) alloc() (Slot, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var s Slot
	if n := len(a.free); n > 0 {
		// Reuse the lowest free id; the list is short (ids of ended sessions).
		i := 0
		for j := 1; j < n; j++ {
			if a.free[j] < a.free[i] {
				i = j
			}
		}
		s = a.free[i]
		a.free[i] = a.free[n-1]
		a.free = a.free[:n-1]
	} else {
		if a.next == MaxSlot {
			return 0, false
		}
		s = a.next
		a.next++
	}
	a.pins[s] = 1
	return s, true
}

// Pin keeps slot s from being reused until the returned function is
// called (once). A transport that stored s somewhere a later session could
// misread (a shared-memory word) pins it until it has cleared those words.
// Pinning a slot that is already free returns false and a no-op.
func (a *Slots) Pin(s Slot) (unpin func(), ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pins[s] == 0 {
		return func() {}, false
	}
	a.pins[s]++
	var once sync.Once
	return func() { once.Do(func() { a.unpin(s) }) }, true
}

func (a *Slots) unpin(s Slot) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pins[s]--; a.pins[s] == 0 {
		delete(a.pins, s)
		a.free = append(a.free, s)
	}
}

// Live reports whether s belongs to a session that has not ended, or has
// ended and is still pinned (its words are being released): a word naming
// any other slot was not written by a session of this daemon.
func (a *Slots) Live(s Slot) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pins[s] > 0
}

// InUse returns the number of slots that cannot be handed out now.
func (a *Slots) InUse() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pins)
}
