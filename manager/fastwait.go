package manager

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// Fast-path waits: clients sleep on the words' futexes for their whole
// timeout (statemem/waiters.go), each holding an entry of the segment's
// waiter table. This file gives the segment its table, lists the entries
// for status, and frees a session's entries and heir reservations when it
// ends. Entries are data: an offset counts only when it names an object in
// the daemon's own table, a slot only when a live attached session holds
// it, and a count is only compared with 0.

// waitTableEntries is how many entries the waiter table of a segment of
// capacity slots gets: statemem.WaitEntries, or fewer so that the table
// takes at most an eighth of a small segment.
func waitTableEntries(capacity int) uint32 {
	n := uint32(capacity/8) * statemem.SlotSize / statemem.EntrySize
	return min(n, statemem.WaitEntries)
}

// allocWaitTable gives seg its waiter table, when it has room for one.
func allocWaitTable(seg *statemem.Segment) {
	if n := waitTableEntries(seg.Capacity()); n >= 4 {
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
	for _, e := range f.seg.Waits() {
		s := f.attached[Slot(e.Slot)] // nil for a slot no attached session holds
		if s == nil || s.gone.Load() {
			continue
		}
		o, ok := f.byOff[e.Off] // none for anything but a live object's slot
		if !ok {
			continue
		}
		obj, op := o.obj, o.fam.waitOp()
		t, ok := statemem.SinceTime(e.Since)
		if !ok {
			t = time.Now()
		}
		out = append(out, FastWaiter{Session: s.ID, Kind: obj.Kind(), Name: obj.Name(), Op: op, Since: t})
		counts[obj]++
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Since.Before(out[j].Since) })
	return out, counts
}

// endWaits runs when s ends, after its words were released: any heir
// reservation it held is dropped, and the sleepers of every object its
// entries say it waited on are woken (of every lock-like object while the
// table counts unrecorded waits, one of which may be s's): a waiter of s
// may have been woken by a release (which wakes one) and died before
// taking the lock or passing the wake-up on. Then its entries are freed.
func (f *fastPath) endWaits(s *Session) {
	slot := uint32(s.Slot())
	entries := f.seg.Waiting(slot)
	f.mu.Lock()
	var locks, waited []uint32
	for off, o := range f.byOff {
		if statemem.HasHeir(f.refs[o.obj].Kind()) {
			locks = append(locks, off)
		}
	}
	for _, e := range entries {
		if _, ok := f.byOff[e.Off]; ok { // data: only an offset the daemon knows counts
			waited = append(waited, e.Off)
		}
	}
	f.mu.Unlock()
	if f.seg.Unrecorded() {
		waited = locks
	}
	for _, off := range locks {
		if statemem.HasHeir(uint8(atomic.LoadUint32(f.seg.Tag(off)))) && statemem.DropHeir(f.seg.Heir(off), slot) {
			statemem.WakeAll(f.seg.State(off))
		}
	}
	for _, off := range waited {
		statemem.WakeAll(f.seg.State(off))
	}
	f.seg.ClearWaiting(slot)
}
