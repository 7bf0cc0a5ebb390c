package server

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/wire"
)

// Admission of connections in the handshake (issue 12, items 3 and 11).
//
// Connections that have not authenticated yet cost the daemon a goroutine
// and a slot until their handshake deadline. To keep a flood of idle or
// hostile peers from locking everyone out:
//
//   - Unix-socket and TCP peers have separate budgets (MaxUnauthenticated
//     each): no TCP peer can take a local client's slot.
//   - A TCP source address may hold at most perSource pending handshakes;
//     when it wants more, its own oldest pending handshake is dropped.
//   - When a budget is full, the oldest pending handshake of the source that
//     holds the most is dropped to make room, preferring peers that have sent
//     nothing yet (as sshd's MaxStartups drops
//     rather than refusing every newcomer): an honest client finishes its
//     handshake in milliseconds and is gone from the list long before an
//     attacker's newer connections reach it.
//   - After failBackoffAfter failed handshakes in a row, a source (TCP
//     address, or uid for Unix peers) is refused for a delay that doubles
//     with each further failure (100 ms to 30 s); a success resets it.
//   - Refusals are logged at most once a second, with a count.
type admission struct {
	unixCap, tcpCap, perSource int
	log                        zerolog.Logger

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
	failBackoffMax   = 30 * time.Second
	failForget       = time.Minute
)

func newAdmission(budget int, log zerolog.Logger) *admission {
	return &admission{unixCap: budget, tcpCap: budget, perSource: max(4, budget/8), log: log,
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

// admit enters c in the handshake budget, dropping an older pending
// handshake when the budget is full. It returns false (and has answered and
// closed c) when c's source is backing off after failed handshakes.
func (a *admission) admit(c *conn) bool {
	src, pool := source(c.nc)
	now := time.Now()
	var evict []*conn
	a.mu.Lock()
	if f, ok := a.fails[src]; ok && f.n >= failBackoffAfter {
		if wait := backoff(f.n) - now.Sub(f.last); wait > 0 {
			a.mu.Unlock()
			c.srv.cfg.Metrics.Refused(transportOf(c.nc), "backoff")
			a.refuse(c, wire.CodeLimit, fmt.Sprintf("too many failed handshakes from this source; retry in %v", wait.Round(time.Millisecond)), src)
			return false
		}
	}
	if pool == poolTCP && a.count[src] >= a.perSource {
		if v := a.oldestLocked(src, pool); v != nil {
			evict = append(evict, v)
			a.removeLocked(v)
		}
	}
	capacity := a.unixCap
	if pool == poolTCP {
		capacity = a.tcpCap
	}
	for a.pools[pool] >= capacity {
		v := a.oldestLocked(a.heaviestLocked(pool), pool)
		if v == nil {
			break
		}
		evict = append(evict, v)
		a.removeLocked(v)
	}
	a.pending[c] = pendingEntry{src: src, pool: pool, at: now, progress: new(atomic.Bool)}
	a.count[src]++
	a.pools[pool]++
	a.mu.Unlock()
	for _, v := range evict {
		c.srv.cfg.Metrics.Refused(transportOf(v.nc), "handshakes")
		v.close()
	}
	if len(evict) > 0 {
		a.logRefusal("handshake budget full; dropped the oldest pending handshake", src)
	}
	return true
}

// leave takes c out of the budget when its handshake ends; authFailed
// counts a wrong key against its source, ok clears the source's record.
func (a *admission) leave(c *conn, ok, authFailed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, found := a.pending[c]
	if found {
		a.removeLocked(c)
	} else {
		e.src, _ = source(c.nc)
	}
	switch {
	case ok:
		delete(a.fails, e.src)
	case authFailed:
		f := a.fails[e.src]
		if time.Since(f.last) > failForget {
			f.n = 0
		}
		f.n++
		f.last = time.Now()
		a.fails[e.src] = f
		if len(a.fails) > 4096 {
			for k, v := range a.fails {
				if time.Since(v.last) > backoff(v.n) {
					delete(a.fails, k)
				}
			}
		}
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

// oldestLocked returns the oldest pending handshake of src in pool whose
// peer has sent nothing, else the oldest.
func (a *admission) oldestLocked(src string, pool int) *conn {
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
	return best
}

// better says whether e should be dropped before f: silent before
// answering, then older first.
func better(e, f pendingEntry) bool {
	ep, fp := e.progress.Load(), f.progress.Load()
	if ep != fp {
		return !ep
	}
	return e.at.Before(f.at)
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

// refuse answers a connection that was not admitted with an error frame
// (the client reports it, e.g. "server busy") and closes it.
func (a *admission) refuse(c *conn, code wire.Code, msg, src string) {
	_ = c.nc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	c.writeHandshakeError(code, msg)
	c.close()
	a.logRefusal(msg, src)
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
