package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/metrics"
	"github.com/syncmgr/syncmgr/shmregistry"
)

// DefaultMaxParked is how many requests one session may have waiting at
// once by default. A waiting request costs a few KiB (its goroutine, timer
// and context), so this caps one client at tens of MB.
const DefaultMaxParked = 10000

// DefaultMaxConnsPerPeer is how many connections one client may have open
// by default: an eighth of the default --max-conns, so that one client
// cannot take every connection.
const DefaultMaxConnsPerPeer = 1024

// DefaultEventLoopMinConns is how many plain connections the daemon has
// before event loops serve them (Config.EventLoopMinConns).
const DefaultEventLoopMinConns = 8

// Version is the daemon's version string.
const Version = "0.1.0"

// Config configures a Server.
type Config struct {
	Key                []byte                // the authkey; required
	MaxFrame           uint32                // largest frame body after the handshake
	HandshakeTimeout   time.Duration         // deadline on the whole handshake
	WriteTimeout       time.Duration         // a reply not written in this time kills the connection
	MaxUnauthenticated int                   // connections allowed in the handshake at once, for Unix and for TCP each
	MaxConns           int                   // authenticated connections allowed at once
	MaxParked          int64                 // requests one session may have waiting at once
	MaxConnsPerPeer    int                   // connections one client (Unix uid and pid, TCP source address) may have at once
	AllowOtherUsers    bool                  // accept Unix peers with another uid
	Shm                *shmregistry.Registry // shared-memory segments; nil disables the shm ops
	Logger             zerolog.Logger
	Metrics            *metrics.Metrics // counters to update; nil records nothing

	// EventLoops is how many event loops serve connections (Unix, TCP and
	// TLS) after their handshake (evloop.go): 0 for the
	// default, half of GOMAXPROCS and at least one; negative for none, each
	// connection then served by a goroutine of its own.
	EventLoops int
	// EventLoopMinConns is how many plain connections the daemon must have
	// before they are served by event loops (0: 8); below it each has a
	// goroutine of its own, which answers a lone client sooner.
	EventLoopMinConns int
}

// Server serves a manager over any number of listeners.
type Server struct {
	cfg    Config
	mgr    *manager.Manager
	ops    *opTable
	log    zerolog.Logger
	bootID string
	runID  string // random, new at each start: told in the handshake
	start  time.Time

	ctx    context.Context // cancelled on shutdown
	cancel context.CancelFunc

	mu        sync.Mutex
	listeners []net.Listener
	conns     map[*conn]struct{}
	peerConns map[string]int // connections (past the peer check) by peer key
	wg        sync.WaitGroup // connection goroutines

	nextConn atomic.Uint64
	unauth   atomic.Int64
	adm      *admission
	authed   atomic.Int64
	closing  atomic.Bool

	shmWatched sync.Map // session id -> struct{}: sessions whose attachments are forgotten when they end

	loopsOnce sync.Once
	loops     []*evLoop    // started on first use; see evloop.go
	plain     atomic.Int64 // authenticated plain (Unix, TCP) connections
}

// New returns a server for mgr.
func New(cfg Config, mgr *manager.Manager) (*Server, error) {
	if len(cfg.Key) == 0 {
		return nil, errors.New("server: no authkey")
	}
	if cfg.MaxFrame == 0 {
		cfg.MaxFrame = 64 << 20
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 5 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.MaxUnauthenticated <= 0 {
		cfg.MaxUnauthenticated = 128
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 8192
	}
	if cfg.MaxConnsPerPeer <= 0 {
		cfg.MaxConnsPerPeer = DefaultMaxConnsPerPeer
	}
	if cfg.EventLoopMinConns <= 0 {
		cfg.EventLoopMinConns = DefaultEventLoopMinConns
	}
	if cfg.MaxParked <= 0 {
		cfg.MaxParked = DefaultMaxParked
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, mgr: mgr, ops: newOpTable(), log: cfg.Logger, bootID: BootID(), runID: newRunID(), start: time.Now(),
		ctx: ctx, cancel: cancel, conns: make(map[*conn]struct{}), peerConns: make(map[string]int), adm: newAdmission(cfg.MaxUnauthenticated, cfg.Logger)}, nil
}

// Manager returns the served manager.
func (s *Server) Manager() *manager.Manager { return s.mgr }

// Serve accepts connections on ln until Shutdown. It returns nil after a
// shutdown and the accept error otherwise.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.listeners = append(s.listeners, ln)
	s.mu.Unlock()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// e.g. EMFILE: out of file descriptors. Keep serving the
				// connections we have and try again shortly.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn().Err(err).Dur("retry_in", backoff).Msg("accept failed")
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		backoff = 0
		c := s.newConn(nc)
		s.adm.admit(c) // see admission.go
		s.unauth.Add(1)
		// wg.Add under mu, after checking closing: Shutdown sets closing
		// before it takes mu and later waits on wg, so no Add can race
		// with that Wait.
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			s.unauth.Add(-1)
			s.adm.leave(c)
			nc.Close()
			return nil
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
		}()
	}
}

func isTemporary(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "too many open files") || strings.Contains(msg, "resource temporarily unavailable")
}

// peerFull reports whether peer key k is at --max-conns-per-client.
func (s *Server) peerFull(k string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peerConns[k] >= s.cfg.MaxConnsPerPeer
}

// reservePeer counts one more authenticated connection from peer key k; it
// reports false (counting nothing) when k is at --max-conns-per-client.
func (s *Server) reservePeer(k string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peerConns[k] >= s.cfg.MaxConnsPerPeer {
		return false
	}
	s.peerConns[k]++
	return true
}

func (s *Server) releasePeer(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peerConns[k]--; s.peerConns[k] <= 0 {
		delete(s.peerConns, k)
	}
}

func (s *Server) track(c *conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		if s.closing.Load() {
			return false
		}
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	return true
}

// Shutdown stops accepting, answers every parked request with
// shutting_down, tells every connection that the daemon is stopping (an
// error frame with request id 0, code shutting_down), closes them and waits
// for them (until ctx ends). Listeners created by Listen remove their
// socket files. The notice lets a client whose only link to the daemon is
// an idle connection (a fast-path sleeper's anchor, a pooled connection)
// say "shutting down" rather than "gone".
func (s *Server) Shutdown(ctx context.Context) error {
	if s.closing.Swap(true) {
		return nil
	}
	s.mu.Lock()
	for _, ln := range s.listeners {
		ln.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.mgr.Close() // every waiter fails with ErrShutdown and is answered
	for _, c := range conns {
		c.drainParked(ctx)
	}
	var told sync.WaitGroup
	for _, c := range conns {
		told.Add(1)
		go func() { defer told.Done(); c.notifyShutdown() }()
	}
	told.Wait()
	s.cancel()
	for _, c := range conns {
		c.close()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		s.stopLoops()
		return nil
	case <-ctx.Done():
		s.stopLoops() // ends the connections still in a loop
		return fmt.Errorf("shutdown: %w", ctx.Err())
	}
}

// Stats are counters for status listings.
type Stats struct {
	Version         string  `msgpack:"version"`
	PID             int     `msgpack:"pid"`
	Uptime          float64 `msgpack:"uptime"`
	Connections     int64   `msgpack:"connections"`
	Handshaking     int64   `msgpack:"handshaking"`
	Objects         int     `msgpack:"objects"`
	Sessions        int     `msgpack:"sessions"`
	BootID          string  `msgpack:"boot_id"`
	RunID           string  `msgpack:"run_id"`
	MaxFrame        uint32  `msgpack:"max_frame"`
	ObjectsListed   int     `msgpack:"objects_listed"`
	ObjectsOmmitted int     `msgpack:"objects_omitted"`
	Goroutines      int     `msgpack:"goroutines"`
	RSS             int64   `msgpack:"rss"` // resident set size in bytes, 0 where unknown
}

// RSS returns this process's resident set size in bytes, or 0.
func RSS() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	var pages int64
	if _, err := fmt.Sscan(f[1], &pages); err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// newRunID returns a random id for this run of the daemon.
func newRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// RunID returns the id of this run of the daemon, sent in every handshake.
func (s *Server) RunID() string { return s.runID }

// BootID returns the host's boot id, or "" where there is none.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

var osPID = os.Getpid()

// waiting lists every parked request of every connection, longest first.
func (s *Server) waiting() []Waiting {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	now := time.Now()
	out := []Waiting{}
	for _, c := range conns {
		out = c.waiting(now, out)
	}
	for _, w := range s.mgr.FastWaiting() { // asleep on a futex: known from the segment's waiter records
		out = append(out, Waiting{Session: w.Session, Kind: string(w.Kind), Name: w.Name, Op: w.Op,
			For: max(now.Sub(w.Since).Seconds(), 0)})
	}
	out = s.queueWaiting(now, out)
	sort.Slice(out, func(i, j int) bool { return out[i].For > out[j].For })
	return out
}
