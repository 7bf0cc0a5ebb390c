package manager

import (
	"sort"
	"time"
)

// What status listings show of the objects and sessions.

// ObjectInfo describes one object for status listings.
type ObjectInfo struct {
	Kind      Kind   `msgpack:"kind"`
	Name      string `msgpack:"name"`
	State     string `msgpack:"state"`
	Waiters   int    `msgpack:"waiters"`
	Refs      int    `msgpack:"refs"`
	Anonymous bool   `msgpack:"anonymous"`
	// HeldFor is how long the current holder of a Lock or RLock has held
	// it, in seconds; absent when it is free or for other kinds.
	HeldFor float64 `msgpack:"held_for,omitempty"`
	// Items and Bytes: a Queue's or JoinableQueue's depth (absent for
	// other kinds).
	Items int64 `msgpack:"items,omitempty"`
	Bytes int64 `msgpack:"bytes,omitempty"`
}

// SessionInfo describes one session for status listings.
type SessionInfo struct {
	ID    uint64 `msgpack:"id"`
	PID   int    `msgpack:"pid"`
	Label string `msgpack:"label"`
	Conns int    `msgpack:"conns"`
	Holds int    `msgpack:"holds"`
}

// Count returns the number of objects and sessions.
func (m *Manager) Count() (objects, sessions int) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.objects), len(m.sessions)
}

// Snapshot lists objects (sorted by name, at most limit when limit > 0) and
// sessions (sorted by id).
func (m *Manager) Snapshot(limit int) ([]ObjectInfo, []SessionInfo) {
	m.mu.RLock()
	type named struct {
		e    *entry
		name string
	}
	es := make([]named, 0, len(m.objects))
	for n, e := range m.objects {
		es = append(es, named{e, n})
	}
	refs := make(map[*entry]int, len(es))
	for _, x := range es {
		refs[x.e] = x.e.refs
	}
	ss := make([]SessionInfo, 0, len(m.sessions))
	sessions := make([]*Session, 0, len(m.sessions))
	slots := make(map[Slot]*Session, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, SessionInfo{ID: s.ID, PID: s.PID, Label: s.Label, Conns: s.conns})
		sessions = append(sessions, s)
		slots[s.Slot()] = s
	}
	m.mu.RUnlock()
	bySlot := func(sl Slot) *Session { return slots[sl] }
	sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
	held := make(map[Slot]int) // from the objects' words: fast-path holds included
	for _, x := range es {
		if h, ok := x.e.obj.(interface{ heldBy(map[Slot]int) }); ok {
			h.heldBy(held)
		}
	}
	if limit > 0 && len(es) > limit {
		es = es[:limit]
	}
	fastWaits := m.fastWaitCounts() // asleep on the objects' futexes: from the waiter records
	objs := make([]ObjectInfo, len(es))
	for i, x := range es {
		var st string
		var w int
		if d, ok := x.e.obj.(ownerDescriber); ok {
			st, w = d.describeBy(bySlot)
		} else {
			st, w = x.e.obj.Describe()
		}
		w += fastWaits[x.e.obj]
		objs[i] = ObjectInfo{Kind: x.e.obj.Kind(), Name: x.name, State: st, Waiters: w, Refs: refs[x.e], Anonymous: x.e.anon}
		if h, ok := x.e.obj.(interface{ HeldSince() (time.Time, bool) }); ok {
			if since, held := h.HeldSince(); held {
				objs[i].HeldFor = time.Since(since).Seconds()
			}
		}
		if q, ok := x.e.obj.(*Queue); ok {
			objs[i].Items, objs[i].Bytes = q.Depth()
		}
	}
	for i, s := range sessions {
		ss[i].Holds = held[s.Slot()]
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].ID < ss[j].ID })
	return objs, ss
}
