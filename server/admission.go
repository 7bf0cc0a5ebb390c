package server

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Admission of connections in the handshake (issue 12, items 3 and 11;
// issue 22, findings 3 and 5).
//
// Connections that have not authenticated yet cost the daemon a goroutine
// and a slot until their handshake deadline. To keep a flood of idle or
// hostile peers from locking everyone out:
//
//   - Unix-socket and TCP peers have separate budgets (MaxUnauthenticated
//     each): no TCP peer can take a local client's slot.
//   - When a budget is full, a pending handshake of the source (TCP
//     address, or uid for Unix peers) that holds the most is dropped to
//     make room (as sshd's MaxStartups drops rather than refusing every
//     newcomer): a flood from one address pushes out its own pending
//     handshakes, not another address's; there is no smaller cap per
//     address, so
//     the clients that share the flood's address (one host, one NAT) have
//     the whole budget's turnover to answer in.
//   - Which one: a handshake whose key was wrong (it waits out its
//     penalty) first, then one whose peer has sent nothing, oldest first;
//     one that has sent bytes goes last. Clients speak first (a ready frame
//     as soon as they are connected, before the server's hello), and bytes
//     already waiting in the socket count as sent (a peek); over TLS the
//     client's TLS handshake counts. An honest client thus has sent bytes
//     from about its first moment in the budget, and idle connections from
//     its own address, however fast they are reopened, are dropped before
//     it.
//   - A peer that has spoken is dropped only once it has owed the daemon
//     an answer for answerGrace: since the daemon's hello went out (or,
//     before that, since it was admitted: over TLS, its TLS handshake), the
//     longest-owing first. A flood that sends the ready frame and then
//     nothing looks like a client until then; an honest client answers the
//     hello within a round trip. When every handshake of the busiest
//     source is still within its grace, the newcomer waits (the accept loop
//     does: others stay in the kernel's queue) until one's grace ends or a
//     handshake ends, instead of dropping one that may be a client about
//     to answer (issue 31). Without it, a flood reopening its connections
//     as fast as the daemon drops them turned the budget over every
//     budget/accept-rate seconds (about 40 ms on two cores), and a client
//     whose answer took longer than that was dropped: about 1 in 20 first
//     tries over TCP. The wait is bounded by answerGrace, and it bounds
//     the turnover to MaxUnauthenticated per answerGrace.
//   - Wrong keys are slowed down, right keys never: after failBackoffAfter
//     failed handshakes from a source (TCP address, or uid for Unix peers)
//     within failForget, the answer to each further wrong key waits a
//     delay that doubles per failure (100 ms to failBackoffMax) in its
//     pending slot. A handshake with the right MAC is answered at once and
//     is never refused for other handshakes' failures.
//   - Refusals are logged at most once a second, with a count.
type admission struct {
	unixCap, tcpCap int
	log             zerolog.Logger

	mu      sync.Mutex
	pending map[*conn]pendingEntry
	count   map[string]int // source -> pending handshakes
	pools   [2]int         // pending handshakes per pool (unix, tcp)
	fails   map[string]failRecord
	changed [2]chan struct{} // per pool: a handshake ended or failed (wakes a waiting admit)

	logMu      sync.Mutex
	lastLog    time.Time
	suppressed int
}

type pendingEntry struct {
	src      string
	pool     int
	at       time.Time
	progress *atomic.Bool  // the peer has sent handshake bytes
	failed   *atomic.Bool  // its key was wrong: it waits out its penalty
	hello    *atomic.Int64 // when the daemon's hello went out (UnixNano); 0 before
}

// owedSince is when the peer's answer became due: when the daemon's hello
// went out, or before that its admission (a TLS peer owes its part of the
// TLS handshake).
func (e pendingEntry) owedSince() time.Time {
	if h := e.hello.Load(); h != 0 {
		return time.Unix(0, h)
	}
	return e.at
}

// progressConn marks its flag once the peer has sent anything, and the
// time of the daemon's first write (its hello).
type progressConn struct {
	net.Conn
	flag  *atomic.Bool
	hello *atomic.Int64
}

func (p progressConn) Read(b []byte) (int, error) {
	n, err := p.Conn.Read(b)
	if n > 0 {
		p.flag.Store(true)
	}
	return n, err
}

func (p progressConn) Write(b []byte) (int, error) {
	n, err := p.Conn.Write(b)
	if n > 0 && p.hello.Load() == 0 {
		p.hello.Store(time.Now().UnixNano())
	}
	return n, err
}

// watch returns c's connection for the handshake, wrapped so that the
// admission sees when the peer answers: a peer that has sent its part is
// dropped only when no silent one is left to drop.
func (a *admission) watch(c *conn) net.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.pending[c]; ok {
		return progressConn{Conn: c.nc, flag: e.progress, hello: e.hello}
	}
	return c.nc
}

type failRecord struct {
	n    int
	last time.Time
}

const (
	poolUnix = 0
	poolTCP  = 1

	failBackoffAfter = 5
	failBackoffMin   = 100 * time.Millisecond
	failBackoffMax   = 10 * time.Second
	failForget       = time.Minute

	// answerGrace is how long a peer that has spoken keeps its pending
	// handshake against newcomers from its source once it owes an answer
	// (see owedSince). Honest clients answer within a round trip and
	// scheduling; the grace also caps how fast newcomers can turn the
	// budget over: MaxUnauthenticated per answerGrace.
	answerGrace = 50 * time.Millisecond
)

func newAdmission(budget int, log zerolog.Logger) *admission {
	return &admission{unixCap: budget, tcpCap: budget, log: log,
		pending: make(map[*conn]pendingEntry), count: make(map[string]int), fails: make(map[string]failRecord),
		changed: [2]chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1)}}
}

// source names the peer of nc for the per-source budget and back-off: the
// IP address for TCP, the uid for a Unix socket.
func source(nc net.Conn) (string, int) {
	if uc, ok := nc.(*net.UnixConn); ok {
		if raw, err := uc.SyscallConn(); err == nil {
			var uid uint32 = 1<<32 - 1
			_ = raw.Control(func(fd uintptr) {
				if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
					uid = cred.Uid
				}
			})
			return fmt.Sprintf("uid:%d", uid), poolUnix
		}
		return "unix", poolUnix
	}
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String(), poolTCP
	}
	if h, _, err := net.SplitHostPort(nc.RemoteAddr().String()); err == nil {
		return h, poolTCP
	}
	return nc.RemoteAddr().String(), poolTCP
}

// admit enters c in the handshake budget, dropping another pending
// handshake when the budget is full. It never refuses c: failed handshakes
// are slowed down in penalty, not by turning newcomers away. When every
// pending handshake it could drop is still within its answerGrace, it
// waits (at most that long, unless c's context ends) for one to leave the
// budget or run out of grace.
func (a *admission) admit(c *conn) {
	src, pool := source(c.nc)
	e := pendingEntry{src: src, pool: pool, at: time.Now(), progress: new(atomic.Bool), failed: new(atomic.Bool), hello: new(atomic.Int64)}
	if tc, ok := c.nc.(*tls.Conn); ok {
		if sc, ok := tc.NetConn().(*sniffConn); ok {
			e.progress = &sc.spoke // a TLS client speaks first: its handshake counts
		}
	}
	capacity := a.unixCap
	if pool == poolTCP {
		capacity = a.tcpCap
	}
	dropped := 0
	for {
		var evict []*conn
		var wake time.Time
		a.mu.Lock()
		for a.pools[pool] >= capacity {
			v, until := a.victimLocked(a.heaviestLocked(pool), pool, time.Now())
			if v == nil {
				wake = until
				break
			}
			evict = append(evict, v)
			a.removeLocked(v)
		}
		if a.pools[pool] < capacity || wake.IsZero() || c.ctx.Err() != nil {
			e.at = time.Now() // its grace starts now, not while it waited
			a.pending[c] = e
			a.count[src]++
			a.pools[pool]++
			wake = time.Time{}
		}
		a.mu.Unlock()
		for _, v := range evict {
			c.srv.cfg.Metrics.Refused(transportOf(v.nc), "handshakes")
			v.close()
		}
		dropped += len(evict)
		if wake.IsZero() {
			break
		}
		t := time.NewTimer(time.Until(wake))
		select {
		case <-t.C:
		case <-a.changed[pool]:
		case <-c.ctx.Done():
		}
		t.Stop()
	}
	if dropped > 0 {
		a.logRefusal("handshake budget full; dropped a pending handshake (wrong keys, silent peers, then the one owing its answer longest)", src)
	}
}

// signal wakes an admit waiting for room in pool.
func (a *admission) signal(pool int) {
	select {
	case a.changed[pool] <- struct{}{}:
	default:
	}
}

// penalty counts a wrong key against c's source and waits, before the
// error frame is sent, for as long as the source's failures ask (nothing
// for the first failBackoffAfter), or until c is closed (dropped from the
// budget, or the daemon stops). It then gives c a second to be answered.
func (a *admission) penalty(c *conn) {
	a.mu.Lock()
	e, found := a.pending[c]
	if !found {
		e.src, _ = source(c.nc)
	} else {
		e.failed.Store(true)
		a.signal(e.pool) // it may be dropped now
	}
	now := time.Now()
	f := a.fails[e.src]
	if now.Sub(f.last) > failForget {
		f.n = 0
	}
	f.n++
	f.last = now
	a.fails[e.src] = f
	wait := backoff(f.n)
	if len(a.fails) > 4096 {
		for k, v := range a.fails {
			if now.Sub(v.last) > failForget {
				delete(a.fails, k)
			}
		}
		if len(a.fails) > 4096 { // failures from very many addresses: bound the memory, forget them
			clear(a.fails)
		}
	}
	a.mu.Unlock()
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.ctx.Done():
	}
	_ = c.nc.SetDeadline(time.Now().Add(time.Second))
}

// leave takes c out of the budget when its handshake ends. Failures were
// counted by penalty; a success clears nothing: the source's record is
// about wrong keys, which a right key from the same address says nothing
// about (and which never slow a right key down).
func (a *admission) leave(c *conn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, found := a.pending[c]; found {
		a.removeLocked(c)
		a.signal(e.pool)
	}
}

func backoff(n int) time.Duration {
	if n < failBackoffAfter {
		return 0
	}
	shift := min(n-failBackoffAfter, 20)
	return min(failBackoffMin<<shift, failBackoffMax)
}

func (a *admission) removeLocked(c *conn) {
	e := a.pending[c]
	delete(a.pending, c)
	if a.count[e.src]--; a.count[e.src] <= 0 {
		delete(a.count, e.src)
	}
	a.pools[e.pool]--
}

// victimLocked returns the pending handshake of src in pool to drop first:
// one whose key was wrong, else the oldest whose peer has sent nothing
// (bytes waiting in its socket count as sent: the goroutine has not read
// them yet), else the one that has owed its answer longest, if for
// answerGrace. When there is none to drop yet, it returns nil and when the
// first one's grace ends.
func (a *admission) victimLocked(src string, pool int, now time.Time) (*conn, time.Time) {
	for {
		var best *conn
		var bestEntry pendingEntry
		for c, e := range a.pending {
			if e.src != src || e.pool != pool {
				continue
			}
			if best == nil || better(e, bestEntry) {
				best, bestEntry = c, e
			}
		}
		switch {
		case best == nil || bestEntry.failed.Load():
			return best, time.Time{}
		case !bestEntry.progress.Load() && hasBytes(best.nc):
			bestEntry.progress.Store(true) // it has spoken: look again
			continue
		case !bestEntry.progress.Load():
			return best, time.Time{}
		}
		if due := bestEntry.owedSince().Add(answerGrace); now.Before(due) {
			return nil, due
		}
		return best, time.Time{}
	}
}

// better says whether e should be dropped before f: wrong keys first, then
// silent before answering (the older first), then the one owing its answer
// longer.
func better(e, f pendingEntry) bool {
	if ef, ff := e.failed.Load(), f.failed.Load(); ef != ff {
		return ef
	}
	ep, fp := e.progress.Load(), f.progress.Load()
	if ep != fp {
		return !ep
	}
	if !ep {
		return e.at.Before(f.at)
	}
	return e.owedSince().Before(f.owedSince())
}

// hasBytes says whether the peer of nc has sent bytes the daemon has not
// read yet (a non-blocking peek on the socket under any TLS layer).
func hasBytes(nc net.Conn) bool {
	for {
		switch c := nc.(type) {
		case *tls.Conn:
			nc = c.NetConn()
			continue
		case *sniffConn:
			nc = c.Conn
			continue
		}
		break
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	got := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		got = err == nil && n > 0
	})
	return got
}

// heaviestLocked returns the source with the most pending handshakes in pool.
func (a *admission) heaviestLocked(pool int) string {
	var src string
	n := 0
	for s, k := range a.count {
		if k > n && a.poolOf(s) == pool {
			src, n = s, k
		}
	}
	return src
}

func (a *admission) poolOf(src string) int {
	for _, e := range a.pending {
		if e.src == src {
			return e.pool
		}
	}
	return -1
}

// pendingCount is the number of connections in the handshake.
func (a *admission) pendingCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pending)
}

// logRefusal logs at most one line a second, counting the others.
func (a *admission) logRefusal(msg, src string) {
	a.logMu.Lock()
	now := time.Now()
	if now.Sub(a.lastLog) < time.Second {
		a.suppressed++
		a.logMu.Unlock()
		return
	}
	n := a.suppressed
	a.suppressed, a.lastLog = 0, now
	a.logMu.Unlock()
	a.log.Warn().Str("source", src).Int("similar_suppressed", n).Msg(msg)
}
