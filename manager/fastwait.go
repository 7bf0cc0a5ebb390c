package manager

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// Fast-path waits: clients sleep on the words' futexes for their whole
// timeout (statemem/waiters.go), counted in their session slot's waiter
// record. This file gives the segment its waiter table, lists the records
// for status, and clears a session's record and heir reservations when it
// ends. Records are data: an offset counts only when it names an object in
// the daemon's own table, and a count is only compared with 0.

// waitTableRecords is how many waiter records a segment of capacity slots
// gets: statemem.WaitRecords, or fewer so that the table takes at most an
// eighth of a small segment.
func waitTableRecords(capacity int) uint32 {
	n := uint32(capacity/8) * statemem.SlotSize / statemem.RecSize
	return min(n, statemem.WaitRecords)
}

// allocWaitTable gives seg its waiter table, when it has room for one.
func allocWaitTable(seg *statemem.Segment) {
	if n := waitTableRecords(seg.Capacity()); n >= 2 {
		_ = seg.AllocWaitTable(n) // no room: waits go unrecorded, no waiter becomes an heir
	}
}

// FastWaiter is a session's wait on the fast path, as its record says.
type FastWaiter struct {
	Session uint64
	Kind    Kind
	Name    string
	Op      string
	Since   time.Time
}

// FastWaiting lists the fast-path waits of live sessions, longest first.
func (m *Manager) FastWaiting() []FastWaiter {
	out, _ := m.fastWaits()
	return out
}

// fastWaitCounts counts the fast-path waits of live sessions per object.
func (m *Manager) fastWaitCounts() map[Object]int {
	_, counts := m.fastWaits()
	return counts
}

func (m *Manager) fastWaits() ([]FastWaiter, map[Object]int) {
	m.mu.RLock()
	f := m.fast
	m.mu.RUnlock()
	if f == nil {
		return nil, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []FastWaiter
	counts := make(map[Object]int)
	for slot, s := range f.attached {
		if s.gone.Load() {
			continue
		}
		for _, e := range f.seg.Waiting(uint32(slot)) {
			obj := f.byOff[e.Off] // nil for anything but a live object's slot
			if obj == nil {
				continue
			}
			op := "acquire"
			if obj.Kind() == KindEvent {
				op = "wait"
			}
			t, ok := statemem.SinceTime(e.Since)
			if !ok {
				t = time.Now()
			}
			out = append(out, FastWaiter{Session: s.ID, Kind: obj.Kind(), Name: obj.Name(), Op: op, Since: t})
			counts[obj]++
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Since.Before(out[j].Since) })
	return out, counts
}

// endWaits runs when s ends, after its words were released: any heir
// reservation it held is dropped, and the sleepers of every object its
// record says it waited on are woken (of every lock-like object when the
// record was full, so that a wait went unrecorded): a waiter of s may have
// been woken by a release (which wakes one) and died before taking the
// lock or passing the wake-up on. Then its record is cleared.
func (f *fastPath) endWaits(s *Session) {
	slot := uint32(s.Slot())
	entries := f.seg.Waiting(slot)
	f.mu.Lock()
	var locks, waited []uint32
	for off, obj := range f.byOff {
		switch obj.(type) {
		case *Lock, *RLock, *Semaphore:
			locks = append(locks, off)
		}
	}
	for _, e := range entries {
		if _, ok := f.byOff[e.Off]; ok { // data: only an offset the daemon knows counts
			waited = append(waited, e.Off)
		}
	}
	f.mu.Unlock()
	if len(entries) == statemem.RecEntries {
		waited = locks
	}
	for _, off := range locks {
		switch uint8(atomic.LoadUint32(f.seg.Tag(off))) {
		case statemem.KindLock, statemem.KindRLock, statemem.KindSemaphore, statemem.KindBoundedSemaphore:
			if statemem.DropHeir(f.seg.Heir(off), slot) {
				statemem.WakeAll(f.seg.State(off))
			}
		}
	}
	for _, off := range waited {
		statemem.WakeAll(f.seg.State(off))
	}
	f.seg.ClearWaiting(slot)
}
