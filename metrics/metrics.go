package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

const namespace = "syncmgr"

// Transports, the values of the "transport" label.
const (
	TransportUnix = "unix"
	TransportTCP  = "tcp"
)

// Snapshot is the daemon's current state as the gauges report it.
type Snapshot struct {
	Sessions    int
	Objects     map[string]int // by kind
	Waiters     map[string]int // blocked requests by the kind of object they wait on
	ShmUsed     int64          // bytes reserved by segments
	ShmLimit    int64          // cap on ShmUsed, 0 for none
	ShmSegments int
	QueueItems  map[string]int64 // items held by queues, by kind
	QueueBytes  map[string]int64 // their bytes, by kind
	// Queues is each queue's depth and waiters, the deepest first, at most
	// MaxQueueSeries of them (a bounded number of series per scrape).
	Queues []QueueDepth
}

// QueueDepth is one queue's gauges.
type QueueDepth struct {
	Kind, Name   string
	Items, Bytes int64
	Waiters      int
}

// MaxQueueSeries bounds the queues reported one by one: the deepest ones
// (by items, then bytes); every queue still counts in the by-kind totals.
const MaxQueueSeries = 100

// Source returns the current Snapshot; it is called once per scrape.
type Source func() Snapshot

// Metrics holds the daemon's collectors. A nil *Metrics is valid: every
// method does nothing.
type Metrics struct {
	reg *prometheus.Registry

	connections       *prometheus.GaugeVec
	connectionsTotal  *prometheus.CounterVec
	handshakeFailures *prometheus.CounterVec
	refused           *prometheus.CounterVec
	ops               *prometheus.CounterVec
	holds             *prometheus.HistogramVec
	deadHolder        *prometheus.CounterVec

	mu     sync.Mutex
	source Source
}

// New returns Metrics registered in a fresh registry, with the Go runtime
// and process collectors beside syncmgr's own.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "connections",
			Help: "Authenticated connections open now, by transport."}, []string{"transport"}),
		connectionsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "connections_total",
			Help: "Connections authenticated since start, by transport."}, []string{"transport"}),
		handshakeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace,
			Name: "handshake_failures_total",
			Help: "Connections that failed the handshake (wrong key, timeout, bad input, TLS), by transport and reason."},
			[]string{"transport", "reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "connections_refused_total",
			Help: "Connections refused before or at the handshake (limits, peer credentials), by transport and reason."},
			[]string{"transport", "reason"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "ops_total",
			Help: "Requests answered, by object kind (\"server\" for ops that address none), op and result (\"ok\" or the error code)."},
			[]string{"kind", "op", "result"}),
		holds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "hold_seconds",
			Help:    "How long a Lock, RLock or Semaphore unit was held, observed at its release, by kind.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 12)}, []string{"kind"}),
		deadHolder: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace,
			Name: "dead_holder_releases_total",
			Help: "Holds released because their session ended (the holder died or disconnected), by kind."},
			[]string{"kind"}),
	}
	m.reg.MustRegister(m.connections, m.connectionsTotal, m.handshakeFailures, m.refused, m.ops, m.holds,
		m.deadHolder, (*snapshotCollector)(m),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry the endpoint serves.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SetSource sets the function the state gauges are read from.
func (m *Metrics) SetSource(s Source) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.source = s
	m.mu.Unlock()
}

// ConnOpened counts an authenticated connection on transport.
func (m *Metrics) ConnOpened(transport string) {
	if m == nil {
		return
	}
	m.connections.WithLabelValues(transport).Inc()
	m.connectionsTotal.WithLabelValues(transport).Inc()
}

// ConnClosed counts the end of a connection ConnOpened counted.
func (m *Metrics) ConnClosed(transport string) {
	if m == nil {
		return
	}
	m.connections.WithLabelValues(transport).Dec()
}

// HandshakeFailed counts a connection that failed its handshake; reason is
// one of a fixed set chosen by the caller.
func (m *Metrics) HandshakeFailed(transport, reason string) {
	if m == nil {
		return
	}
	m.handshakeFailures.WithLabelValues(transport, reason).Inc()
}

// Refused counts a connection the daemon turned away; reason is one of a
// fixed set chosen by the caller.
func (m *Metrics) Refused(transport, reason string) {
	if m == nil {
		return
	}
	m.refused.WithLabelValues(transport, reason).Inc()
}

// Op counts an answered request. kind and op must come from the op table
// (not from the request as sent), result is "ok" or a wire error code.
func (m *Metrics) Op(kind, op, result string) {
	if m == nil {
		return
	}
	m.ops.WithLabelValues(kind, op, result).Inc()
}

// Held observes how long a hold on an object of kind lasted.
func (m *Metrics) Held(kind string, d time.Duration) {
	if m == nil {
		return
	}
	m.holds.WithLabelValues(kind).Observe(d.Seconds())
}

// DeadHolderRelease counts a hold released because its session ended.
func (m *Metrics) DeadHolderRelease(kind string) {
	if m == nil {
		return
	}
	m.deadHolder.WithLabelValues(kind).Inc()
}

var (
	descSessions = prometheus.NewDesc(namespace+"_sessions", "Client sessions open now.", nil, nil)
	descObjects  = prometheus.NewDesc(namespace+"_objects", "Objects the daemon holds, by kind.", []string{"kind"}, nil)
	descWaiters  = prometheus.NewDesc(namespace+"_waiters",
		"Requests blocked now, by the kind of object they wait on.", []string{"kind"}, nil)
	descShmUsed  = prometheus.NewDesc(namespace+"_shm_bytes", "Bytes reserved by shared-memory segments.", nil, nil)
	descShmLimit = prometheus.NewDesc(namespace+"_shm_limit_bytes",
		"Cap on the bytes of all shared-memory segments together (0: none).", nil, nil)
	descShmSegs = prometheus.NewDesc(namespace+"_shm_segments", "Shared-memory segments the daemon owns.", nil, nil)
	descQItems  = prometheus.NewDesc(namespace+"_queue_items", "Items held by queues now, by kind.", []string{"kind"}, nil)
	descQBytes  = prometheus.NewDesc(namespace+"_queue_bytes", "Bytes of the items held by queues now, by kind.", []string{"kind"}, nil)
	queueLabels = []string{"kind", "name"}
	descQDepth  = prometheus.NewDesc(namespace+"_queue_depth_items",
		"Items one queue holds now (the deepest queues, at most 100).", queueLabels, nil)
	descQDepthB = prometheus.NewDesc(namespace+"_queue_depth_bytes",
		"Bytes of the items one queue holds now (the deepest queues, at most 100).", queueLabels, nil)
	descQWait = prometheus.NewDesc(namespace+"_queue_waiters",
		"Gets and puts waiting on one queue now, socket and same-host clients (the deepest queues, at most 100).",
		queueLabels, nil)
)

// snapshotCollector reports the Source's Snapshot at scrape time.
type snapshotCollector Metrics

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSessions, descObjects, descWaiters, descShmUsed, descShmLimit, descShmSegs, descQItems, descQBytes, descQDepth, descQDepthB, descQWait} {
		ch <- d
	}
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	src := c.source
	c.mu.Unlock()
	if src == nil {
		return
	}
	s := src()
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(s.Sessions))
	for kind, n := range s.Objects {
		ch <- prometheus.MustNewConstMetric(descObjects, prometheus.GaugeValue, float64(n), kind)
	}
	for kind, n := range s.Waiters {
		ch <- prometheus.MustNewConstMetric(descWaiters, prometheus.GaugeValue, float64(n), kind)
	}
	ch <- prometheus.MustNewConstMetric(descShmUsed, prometheus.GaugeValue, float64(s.ShmUsed))
	ch <- prometheus.MustNewConstMetric(descShmLimit, prometheus.GaugeValue, float64(s.ShmLimit))
	ch <- prometheus.MustNewConstMetric(descShmSegs, prometheus.GaugeValue, float64(s.ShmSegments))
	for kind, n := range s.QueueItems {
		ch <- prometheus.MustNewConstMetric(descQItems, prometheus.GaugeValue, float64(n), kind)
	}
	for kind, n := range s.QueueBytes {
		ch <- prometheus.MustNewConstMetric(descQBytes, prometheus.GaugeValue, float64(n), kind)
	}
	for i, q := range s.Queues {
		if i == MaxQueueSeries {
			break
		}
		ch <- prometheus.MustNewConstMetric(descQDepth, prometheus.GaugeValue, float64(q.Items), q.Kind, q.Name)
		ch <- prometheus.MustNewConstMetric(descQDepthB, prometheus.GaugeValue, float64(q.Bytes), q.Kind, q.Name)
		ch <- prometheus.MustNewConstMetric(descQWait, prometheus.GaugeValue, float64(q.Waiters), q.Kind, q.Name)
	}
}
