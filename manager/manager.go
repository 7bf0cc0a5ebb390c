package manager

import (
	"sync"
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
