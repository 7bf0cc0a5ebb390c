package manager

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmgr/syncmgr/wire"
)

// Kind names a type of shared object; the strings are the wire names.
type Kind string

// The kinds of objects.
const (
	KindLock             Kind = wire.KindLock
	KindRLock            Kind = wire.KindRLock
	KindSemaphore        Kind = wire.KindSemaphore
	KindBoundedSemaphore Kind = wire.KindBoundedSemaphore
	KindEvent            Kind = wire.KindEvent
	KindValue            Kind = wire.KindValue
	KindQueue            Kind = wire.KindQueue
	KindJoinableQueue    Kind = wire.KindJoinableQueue
	KindCondition        Kind = wire.KindCondition
	KindBarrier          Kind = wire.KindBarrier
	KindDict             Kind = wire.KindDict
	KindList             Kind = wire.KindList
	KindNamespace        Kind = wire.KindNamespace
)

// Object is implemented by every shared object.
type Object interface {
	Name() string
	Kind() Kind
	// Describe reports the object's state for status listings.
	Describe() (state string, waiters int)
	// fail wakes every waiter with err and makes later blocking calls fail.
	fail(err error)
}

// holder is an object in which a session can hold something (a lock, units)
// that must be given back when the session ends.
type holder interface {
	releaseSession(s *Session)
}

// Params are the creation parameters of an object; each kind reads its own.
type Params struct {
	Value    int64         // Semaphore, BoundedSemaphore: initial value
	Typecode string        // Value
	Initial  any           // Value: initial value, as carried on the wire
	MaxSize  int64         // Queue: <= 0 means unbounded
	Lock     string        // Condition: name of a Lock or RLock; "" for a private RLock
	Parties  int64         // Barrier
	Action   bool          // Barrier: the clients run an action when it trips
	Timeout  time.Duration // Barrier: default wait timeout (Forever for none)
}

// Config sets the manager's limits.
type Config struct {
	// ShareGrace is how long an anonymous object that was shared (e.g.
	// pickled) outlives its last reference.
	ShareGrace time.Duration
	// MaxObjectsPerSession caps the live objects one client has created:
	// one peer (see OpenSessionFrom) over all its sessions, so reconnecting
	// does not reset the count. Sessions without a peer count alone.
	MaxObjectsPerSession int
	// MaxObjects caps the objects in the manager.
	MaxObjects int
	// MaxQueue caps a queue's maxsize.
	MaxQueue int64
	// MaxObjectBytes caps the bytes one queue (items and waiting putters'
	// items), dict or list holds, counted with ItemCost; <= 0 for none.
	MaxObjectBytes int64
	// MaxBytes caps those bytes summed over the whole manager; <= 0 for none.
	MaxBytes int64
	// QueueRingBytes is the data capacity of each Queue's ring on the fast
	// path (a power of two; 0: DefaultQueueRingBytes); an item of more than
	// a quarter of it is kept by the daemon.
	QueueRingBytes int64
	// MaxItemBytes caps the items a Queue's ring takes from clients by
	// themselves (0: no cap beyond the ring's): the daemon sets it below its
	// frame limit, so that every item in a ring can be carried to a socket
	// client, and a larger item goes through the daemon, whose frame limit
	// refuses it at put.
	MaxItemBytes int64
	// OnHoldEnd, when set, is called each time a session stops holding an
	// object (its last unit of it released), with the object's mutex held:
	// it must not block or call into the manager.
	OnHoldEnd func(HoldEnd)
}

// HoldEnd describes a hold that ended: a Lock or RLock released, or the last
// unit a session held of a Semaphore.
type HoldEnd struct {
	Kind    Kind
	Name    string
	Session *Session      // the holder
	Label   string        // the holder's label when the hold ended
	Held    time.Duration // since the hold began; negative when unknown (a fast-path hold)
	// SessionEnded is set when the hold was released because the session
	// ended (its process died or disconnected) rather than by a release.
	SessionEnded bool
}

// DefaultConfig returns the daemon's default limits.
func DefaultConfig() Config {
	return Config{ShareGrace: 10 * time.Minute, MaxObjectsPerSession: 262144, MaxObjects: 4 << 20, MaxQueue: 1_000_000,
		MaxObjectBytes: 1 << 30, MaxBytes: 4 << 30, QueueRingBytes: DefaultQueueRingBytes}
}

type entry struct {
	obj     Object
	anon    bool
	refs    int  // references held by sessions (anonymous objects)
	shared  bool // handed to another process: linger for ShareGrace
	grace   *time.Timer
	graceN  uint64 // counts grace periods, so a stale timer knows it is stale
	creator *peer  // whose object count it is in; nil for none
}

// peer is one client as the transport identifies it (a process on this
// host, a source address over TCP), over all its sessions. It counts the
// live objects its sessions created. Guarded by Manager.mu.
type peer struct {
	key      string // "" for a session's private peer (not in Manager.peers)
	created  int
	sessions int
}

// Manager is the registry of named objects and live sessions.
type Manager struct {
	cfg Config

	slots *Slots
	bytes *byteLimits

	mu       sync.RWMutex
	objects  map[string]*entry
	sessions map[uint64]*Session
	byKey    map[string]*Session
	peers    map[string]*peer
	nextID   uint64
	closed   bool
	fast     *fastPath // nil: no fast path (see fastpath.go)
}

// New returns an empty manager.
func New(cfg Config) *Manager {
	return &Manager{cfg: cfg, slots: NewSlots(), bytes: &byteLimits{perObject: cfg.MaxObjectBytes, total: cfg.MaxBytes}, objects: make(map[string]*entry), sessions: make(map[uint64]*Session), byKey: make(map[string]*Session), peers: make(map[string]*peer)}
}

// Slots returns the manager's slot allocator.
func (m *Manager) Slots() *Slots { return m.slots }

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

// maybeCollectLocked deletes an anonymous entry nobody references, or starts
// its grace timer. It returns the deleted object, to be failed outside m.mu.
func (m *Manager) maybeCollectLocked(name string, e *entry) Object {
	if !e.anon || e.refs > 0 || e.grace != nil {
		return nil
	}
	if e.shared && m.cfg.ShareGrace > 0 {
		e.graceN++
		n := e.graceN
		e.grace = time.AfterFunc(m.cfg.ShareGrace, func() { m.collectAfterGrace(name, e, n) })
		return nil
	}
	m.removeLocked(name, e)
	return e.obj
}

// collectAfterGrace deletes e when grace period n has run out. A timer that
// fired while a reference came and went (stopping it too late and starting
// grace period n+1) finds itself stale and does nothing.
func (m *Manager) collectAfterGrace(name string, e *entry, n uint64) {
	m.mu.Lock()
	if cur, ok := m.objects[name]; !ok || cur != e || e.refs > 0 || e.grace == nil || e.graceN != n {
		m.mu.Unlock()
		return
	}
	m.removeLocked(name, e)
	m.mu.Unlock()
	e.obj.fail(ErrDeleted)
}

func (m *Manager) removeLocked(name string, e *entry) {
	delete(m.objects, name)
	m.unbindFast(e.obj)
	if e.grace != nil {
		e.grace.Stop()
		e.grace = nil
	}
	if e.creator != nil {
		e.creator.created--
		m.forgetPeerLocked(e.creator)
	}
}

// forgetPeerLocked drops a peer with no session and no object left.
func (m *Manager) forgetPeerLocked(p *peer) {
	if p.sessions == 0 && p.created == 0 && p.key != "" && m.peers[p.key] == p {
		delete(m.peers, p.key)
	}
}

// Create returns the object called name, creating it when there is none.
// An empty name creates an anonymous object with a generated name, holding
// one reference for s.
func (m *Manager) Create(s *Session, kind Kind, name string, p Params) (obj Object, created bool, err error) {
	anon := name == ""
	if anon {
		name = generateName(kind)
	} else if err := ValidateName(name); err != nil {
		return nil, false, err
	}
	m.mu.RLock()
	e, ok := m.objects[name]
	m.mu.RUnlock()
	if ok {
		if e.obj.Kind() != kind {
			return nil, false, fmt.Errorf("%w: %q is a %s, not a %s", ErrKindMismatch, name, e.obj.Kind(), kind)
		}
		return e.obj, false, nil
	}
	obj, err = m.newObject(kind, name, p)
	if err != nil {
		return nil, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, false, ErrShutdown
	}
	if e, ok := m.objects[name]; ok { // lost a race with another creator
		if e.obj.Kind() != kind {
			return nil, false, fmt.Errorf("%w: %q is a %s, not a %s", ErrKindMismatch, name, e.obj.Kind(), kind)
		}
		return e.obj, false, nil
	}
	if m.cfg.MaxObjects > 0 && len(m.objects) >= m.cfg.MaxObjects {
		return nil, false, fmt.Errorf("%w: the server holds %d objects (--max-objects)", ErrLimit, m.cfg.MaxObjects)
	}
	if s != nil && m.cfg.MaxObjectsPerSession > 0 && s.peer.created >= m.cfg.MaxObjectsPerSession {
		return nil, false, fmt.Errorf("%w: this client has %d live objects it created (--max-objects-per-client)", ErrLimit, s.peer.created)
	}
	e = &entry{obj: obj, anon: anon}
	if s != nil {
		e.creator = s.peer
		s.peer.created++
		if anon {
			e.refs = 1
			s.refs[name]++
		}
	}
	m.objects[name] = e
	m.bindFast(obj)
	return obj, true, nil
}

func (m *Manager) newObject(kind Kind, name string, p Params) (Object, error) {
	switch kind {
	case KindLock:
		return newLock(name), nil
	case KindRLock:
		return newRLock(name), nil
	case KindSemaphore, KindBoundedSemaphore:
		return newSemaphore(name, p.Value, kind == KindBoundedSemaphore)
	case KindEvent:
		return newEvent(name), nil
	case KindValue:
		return newValue(name, p.Typecode, p.Initial)
	case KindQueue:
		if m.cfg.MaxQueue > 0 && p.MaxSize > m.cfg.MaxQueue {
			return nil, fmt.Errorf("%w: maxsize %d is over the server's limit of %d (--max-queue)", ErrValue, p.MaxSize, m.cfg.MaxQueue)
		}
		q := newQueue(name, p.MaxSize)
		q.lim = m.bytes
		return q, nil
	case KindJoinableQueue:
		if m.cfg.MaxQueue > 0 && p.MaxSize > m.cfg.MaxQueue {
			return nil, fmt.Errorf("%w: maxsize %d is over the server's limit of %d (--max-queue)", ErrValue, p.MaxSize, m.cfg.MaxQueue)
		}
		q := newQueue(name, p.MaxSize)
		q.lim = m.bytes
		q.joinable = true
		return q, nil
	case KindCondition:
		var lock condLock = newRLock(name + ".lock")
		if p.Lock != "" {
			obj, err := m.lookupAny(p.Lock)
			if err != nil {
				return nil, err
			}
			l, ok := obj.(condLock)
			if !ok {
				return nil, fmt.Errorf("%w: a condition needs a lock or rlock, %q is a %s", ErrKindMismatch, p.Lock, obj.Kind())
			}
			lock = l
		}
		return newCondition(name, lock), nil
	case KindBarrier:
		return newBarrier(name, p.Parties, p.Action, p.Timeout)
	case KindDict, KindNamespace:
		d := newDict(name, kind)
		d.lim = m.bytes
		return d, nil
	case KindList:
		l := newList(name)
		l.lim = m.bytes
		return l, nil
	default:
		return nil, fmt.Errorf("%w %q", ErrUnknownKind, kind)
	}
}

func (m *Manager) lookupAny(name string) (Object, error) {
	m.mu.RLock()
	e, ok := m.objects[name]
	m.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNoSuchObject, name)
	}
	return e.obj, nil
}

// Lookup returns the object called name, which must be of the given kind.
func (m *Manager) Lookup(kind Kind, name string) (Object, error) {
	m.mu.RLock()
	e, ok := m.objects[name]
	m.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNoSuchObject, name)
	}
	if e.obj.Kind() != kind {
		return nil, fmt.Errorf("%w: %q is a %s, not a %s", ErrKindMismatch, name, e.obj.Kind(), kind)
	}
	return e.obj, nil
}

// Delete removes an object at once; its waiters fail with ErrDeleted.
func (m *Manager) Delete(name string) bool {
	m.mu.Lock()
	e, ok := m.objects[name]
	if ok {
		m.removeLocked(name, e)
	}
	m.mu.Unlock()
	if ok {
		e.obj.fail(ErrDeleted)
	}
	return ok
}

// Incref adds a reference for s to an anonymous object (no-op for named).
func (m *Manager) Incref(s *Session, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.objects[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoSuchObject, name)
	}
	if !e.anon || s.ended {
		return nil
	}
	e.refs++
	s.refs[name]++
	if e.grace != nil {
		e.grace.Stop()
		e.grace = nil
	}
	return nil
}

// Decref drops one of s's references to an anonymous object; the object is
// deleted (or starts its grace period) when no reference is left.
func (m *Manager) Decref(s *Session, name string) error {
	m.mu.Lock()
	e, ok := m.objects[name]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrNoSuchObject, name)
	}
	var dead Object
	if e.anon && s.refs[name] > 0 {
		if s.refs[name]--; s.refs[name] == 0 {
			delete(s.refs, name)
		}
		e.refs--
		dead = m.maybeCollectLocked(name, e)
	}
	m.mu.Unlock()
	if dead != nil {
		dead.fail(ErrDeleted)
	}
	return nil
}

// Share marks an anonymous object as handed to another process, so that it
// outlives its last reference by the share grace.
func (m *Manager) Share(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.objects[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoSuchObject, name)
	}
	e.shared = true
	return nil
}

// Close shuts the manager down: every waiter fails with ErrShutdown, and so
// does every later blocking call and creation.
func (m *Manager) Close() {
	m.mu.Lock()
	var sweeper chan struct{}
	if m.fast != nil && !m.closed {
		close(m.fast.stop)
		sweeper = m.fast.stopped
	}
	m.closed = true
	objs := make([]Object, 0, len(m.objects))
	for _, e := range m.objects {
		if e.grace != nil {
			e.grace.Stop()
		}
		objs = append(objs, e.obj)
	}
	m.mu.Unlock()
	for _, o := range objs {
		o.fail(ErrShutdown)
	}
	if sweeper != nil {
		<-sweeper // it touches the segment, which the caller may unmap next
	}
}

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

// MaxNameLen is the longest object name.
const MaxNameLen = 200

// ValidateName checks a user-supplied object name.
func ValidateName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: a name is 1 to %d bytes long", ErrBadName, MaxNameLen)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%w: %q is reserved", ErrBadName, name)
	}
	if len(name) >= 5 && name[:5] == "anon-" {
		return fmt.Errorf("%w: names starting with \"anon-\" are reserved for anonymous objects", ErrBadName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '_' || c == '-' || c == '.' || c == ':' || c == '@' || c == '+'
		if !ok {
			return fmt.Errorf("%w: byte 0x%02x at %d is not allowed (use A-Z a-z 0-9 _ - . : @ +)", ErrBadName, c, i)
		}
	}
	return nil
}

func generateName(kind Kind) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "anon-" + string(kind) + "-" + hex.EncodeToString(b[:])
}
