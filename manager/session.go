package manager

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Sessions: a client's connections share one, which holds locks and
// units and references; when its last connection closes it ends and
// releases them (OpenSession, CloseSession).

// holder is an object in which a session can hold something (a lock, units)
// that must be given back when the session ends.
type holder interface {
	releaseSession(s *Session)
}

// Session is one client: a process with one or more connections. What it
// holds is released when its last connection closes. Objects name their
// owners by the session's Slot; ID is the never-reused id shown in status
// listings.
type Session struct {
	ID    uint64
	PID   int
	Label string // written under both Manager.mu and mu
	key   string
	slot  Slot

	// guarded by Manager.mu
	conns int
	refs  map[string]int
	peer  *peer
	ended bool
	gone  atomic.Bool // ended, readable without Manager.mu (the fast path's latch)

	// Parked counts the session's requests a transport holds waiting (over
	// all its connections), for the transport's per-session cap.
	Parked atomic.Int64

	mu        sync.Mutex // leaf lock: taken inside object mutexes
	holds     map[holder]int
	holdSince map[holder]time.Time // when each hold began
	ending    bool                 // set when CloseSession starts releasing holds
	onHoldEnd func(HoldEnd)
	onEnd     []func()      // guarded by mu; nil once the session ended
	done      chan struct{} // closed when the session ends
}

// Done is closed when the session has ended and released what it held.
func (s *Session) Done() <-chan struct{} { return s.done }

// Slot returns the session's slot id, the owner id objects record.
func (s *Session) Slot() Slot {
	if s == nil {
		return 0
	}
	return s.slot
}

// OnEnd registers fn to run when the session ends, after its holds have
// been released, in reverse order of registration. It reports false (and
// does not run fn) when the session has already ended. This is where a
// transport hangs its clean-up (shared-memory attachments, words naming the
// slot) instead of watching Done from goroutines of its own.
func (s *Session) OnEnd(fn func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hooksRan() {
		return false
	}
	s.onEnd = append(s.onEnd, fn)
	return true
}

// hooksRan reports whether the end hooks have run; call with s.mu held.
func (s *Session) hooksRan() bool { return s.onEnd == nil }

func (s *Session) hold(h holder) {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.holds[h] == 0 {
		s.holdSince[h] = time.Now()
	}
	s.holds[h]++
	s.mu.Unlock()
}

// heldSince returns when s began holding h.
func (s *Session) heldSince(h holder) (time.Time, bool) {
	if s == nil {
		return time.Time{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.holdSince[h]
	return t, ok
}

func (s *Session) unhold(h holder) {
	if s == nil {
		return
	}
	s.mu.Lock()
	var end *HoldEnd
	if s.holds[h]--; s.holds[h] <= 0 {
		delete(s.holds, h)
		if since, ok := s.holdSince[h]; ok && s.onHoldEnd != nil {
			end = &HoldEnd{Session: s, Label: s.Label, Held: time.Since(since), SessionEnded: s.ending}
			if o, ok := h.(interface {
				Kind() Kind
				Name() string
			}); ok {
				end.Kind, end.Name = o.Kind(), o.Name()
			}
		}
		delete(s.holdSince, h)
	}
	s.mu.Unlock()
	if end != nil {
		s.onHoldEnd(*end)
	}
}

// fastHoldEnded reports the end of a hold the daemon never recorded: a lock
// s took by compare-and-swap on the fast path at since (zero: unknown, and
// Held is then negative), now released by the daemon because s ended.
func (s *Session) fastHoldEnded(h interface {
	Kind() Kind
	Name() string
}, since time.Time) {
	if s == nil || s.onHoldEnd == nil {
		return
	}
	held := time.Duration(-1)
	if !since.IsZero() {
		held = time.Since(since)
	}
	s.mu.Lock()
	end := HoldEnd{Kind: h.Kind(), Name: h.Name(), Session: s, Label: s.Label, Held: held, SessionEnded: s.ending}
	s.mu.Unlock()
	s.onHoldEnd(end)
}

// dropHold forgets s's hold of h without reporting its end: a lock s took
// through the daemon and released by compare-and-swap on the fast path, which
// the daemon learns of only when it next changes the lock (when the hold
// really ended is unknown).
func (s *Session) dropHold(h holder) {
	if s == nil {
		return
	}
	s.mu.Lock()
	delete(s.holds, h)
	delete(s.holdSince, h)
	s.mu.Unlock()
}

// Holds returns how many holdings the session has (locks and units).
func (s *Session) Holds() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.holds {
		n += c
	}
	return n
}

// OpenSession registers a connection. Connections presenting the same
// non-empty key share one session; an empty key makes a session of its own.
// The session counts its objects on its own (see OpenSessionFrom).
func (m *Manager) OpenSession(key []byte, pid int, label string) (*Session, error) {
	return m.OpenSessionFrom("", key, pid, label)
}

// OpenSessionFrom is OpenSession for a connection from peerKey, the
// transport's name for the client (its uid and pid on a Unix socket, its
// source address over TCP): every session of one peer shares its object
// count (Config.MaxObjectsPerSession), so a client that reconnects finds
// its objects still counted. An empty peerKey counts the session alone.
func (m *Manager) OpenSessionFrom(peerKey string, key []byte, pid int, label string) (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrShutdown
	}
	if len(key) > 0 {
		if s, ok := m.byKey[string(key)]; ok {
			s.conns++
			if label != "" {
				s.mu.Lock()
				s.Label = label // status shows the latest connection's label
				s.mu.Unlock()
			}
			return s, nil
		}
	}
	slot, ok := m.slots.alloc()
	if !ok {
		return nil, fmt.Errorf("%w: no free session slot", ErrLimit)
	}
	p := m.peers[peerKey]
	if p == nil {
		p = &peer{key: peerKey}
		if peerKey != "" {
			m.peers[peerKey] = p
		}
	}
	p.sessions++
	m.nextID++
	s := &Session{ID: m.nextID, PID: pid, Label: label, key: string(key), slot: slot, conns: 1, peer: p,
		refs: make(map[string]int), holds: make(map[holder]int), holdSince: make(map[holder]time.Time), onHoldEnd: m.cfg.OnHoldEnd, onEnd: []func(){}, done: make(chan struct{})}
	m.sessions[s.ID] = s
	if len(key) > 0 {
		m.byKey[s.key] = s
	}
	return s, nil
}

// CloseSession unregisters a connection of s. When it was the last one the
// session ends: its references are dropped, its holdings released, its end
// hooks run (see OnEnd), Done is closed, and its slot is freed for reuse
// once nothing pins it (see Slots.Pin). Callers must have finished every
// blocking call made for that connection.
func (m *Manager) CloseSession(s *Session) {
	m.mu.Lock()
	s.conns--
	if s.conns > 0 || s.ended {
		m.mu.Unlock()
		return
	}
	s.ended = true
	s.gone.Store(true)
	s.peer.sessions--
	m.forgetPeerLocked(s.peer)
	delete(m.sessions, s.ID)
	if s.key != "" {
		delete(m.byKey, s.key)
	}
	var dead []Object
	for name, n := range s.refs {
		if e, ok := m.objects[name]; ok {
			e.refs -= n
			if o := m.maybeCollectLocked(name, e); o != nil {
				dead = append(dead, o)
			}
		}
	}
	s.refs = nil
	m.mu.Unlock()
	for _, o := range dead {
		o.fail(ErrDeleted)
	}

	s.mu.Lock()
	s.ending = true
	hs := make([]holder, 0, len(s.holds))
	for h := range s.holds {
		hs = append(hs, h)
	}
	s.mu.Unlock()
	for _, h := range hs {
		h.releaseSession(s)
	}
	s.mu.Lock()
	hooks := s.onEnd
	s.onEnd = nil
	s.mu.Unlock()
	for i := len(hooks) - 1; i >= 0; i-- {
		hooks[i]()
	}
	close(s.done)
	m.slots.unpin(s.slot) // the session's own pin: a hook may hold another
}
