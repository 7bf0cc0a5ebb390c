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

	logMu      sync.Mutex
	lastLog    time.Time
	suppressed int
}

type pendingEntry struct {
	src      string
	pool     int
	at       time.Time
	progress *atomic.Bool // the peer has sent handshake bytes
	failed   *atomic.Bool // its key was wrong: it waits out its penalty
}

// progressConn marks its flag once the peer has sent anything.
type progressConn struct {
	net.Conn
	flag *atomic.Bool
}

func (p progressConn) Read(b []byte) (int, error) {
	n, err := p.Conn.Read(b)
	if n > 0 {
		p.flag.Store(true)
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
		return progressConn{Conn: c.nc, flag: e.progress}
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
)

func newAdmission(budget int, log zerolog.Logger) *admission {
	return &admission{unixCap: budget, tcpCap: budget, log: log,
		pending: make(map[*conn]pendingEntry), count: make(map[string]int), fails: make(map[string]failRecord)}
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
// are slowed down in penalty, not by turning newcomers away.
func (a *admission) admit(c *conn) {
	src, pool := source(c.nc)
	e := pendingEntry{src: src, pool: pool, at: time.Now(), progress: new(atomic.Bool), failed: new(atomic.Bool)}
	if tc, ok := c.nc.(*tls.Conn); ok {
		if sc, ok := tc.NetConn().(*sniffConn); ok {
			e.progress = &sc.spoke // a TLS client speaks first: its handshake counts
		}
	}
	var evict []*conn
	a.mu.Lock()
	capacity := a.unixCap
	if pool == poolTCP {
		capacity = a.tcpCap
	}
	for a.pools[pool] >= capacity {
		v := a.victimLocked(a.heaviestLocked(pool), pool)
		if v == nil {
			break
		}
		evict = append(evict, v)
		a.removeLocked(v)
	}
	a.pending[c] = e
	a.count[src]++
	a.pools[pool]++
	a.mu.Unlock()
	for _, v := range evict {
		c.srv.cfg.Metrics.Refused(transportOf(v.nc), "handshakes")
		v.close()
	}
	if len(evict) > 0 {
		a.logRefusal("handshake budget full; dropped a pending handshake (wrong keys and silent peers first)", src)
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
	if _, found := a.pending[c]; found {
		a.removeLocked(c)
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
// them yet), else the oldest.
func (a *admission) victimLocked(src string, pool int) *conn {
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
		if best == nil || bestEntry.failed.Load() || bestEntry.progress.Load() || !hasBytes(best.nc) {
			return best
		}
		bestEntry.progress.Store(true) // it has spoken: look again
	}
}

// better says whether e should be dropped before f: wrong keys first, then
// silent before answering, then older first.
func better(e, f pendingEntry) bool {
	if ef, ff := e.failed.Load(), f.failed.Load(); ef != ff {
		return ef
	}
	ep, fp := e.progress.Load(), f.progress.Load()
	if ep != fp {
		return !ep
	}
	return e.at.Before(f.at)
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
