package manager

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"
)

// The registry: objects by name, their creation (with the limits on it),
// lookup, references of anonymous objects and their collection.

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
