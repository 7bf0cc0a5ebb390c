package server

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/metrics"
	"github.com/syncmgr/syncmgr/wire"
)

// An event loop serves the connections given to it (Unix, TCP, and TLS
// over TCP: evloop_tls.go), at their handshake or between two requests
// once the server is busy (conn.loopsWanted): one goroutine waits in its
// own epoll set and reads, executes and answers the requests of every
// connection that is ready, with no hand-off between threads on the way.
// With a goroutine per connection each request cost a wake-up of the
// runtime's poller thread and a switch to the connection's goroutine; here
// one epoll_wait serves every connection that became ready meanwhile, and
// while requests keep coming the loop looks for the next ones without
// sleeping (a poll with no timeout, a system call the runtime does not
// track).
//
// What a connection is promised does not change:
//   - its requests are read and executed one at a time, in order, by one
//     goroutine (the loop's);
//   - a request that waits is parked in a goroutine of its own, as before
//     (conn.park), and writes its reply itself;
//   - a granting op's grant is committed once its reply is in the socket,
//     and undone when the connection ends first. A reply the socket cannot
//     take at once waits in the connection's output queue with its grant;
//     the loop writes it when the socket drains (EPOLLOUT) and commits the
//     grant then, or undoes it when the connection ends first;
//   - a client that stops reading stops being read (its requests stay in
//     its socket) once outLimit bytes of replies wait for it, and is closed
//     when its output has made no progress for WriteTimeout. Requests that
//     one read brought past that point are not run either: they wait in
//     loopConn.rest until the replies drain;
//   - a connection whose turn ended with more to read is read again once
//     per round (loopConn.queued), however often its turns end.
//
// Who owns the descriptor: the loop is its only reader; writers hold
// conn.wmu and check closed; the loop sets closed (under wmu) when it lets
// go of the connection, and the connection's serve goroutine closes the
// descriptor after that, so a number the kernel hands out again is never
// read or written by mistake. conn.close only shuts the socket down, which
// the loop sees as the end of the stream.
type evLoop struct {
	srv    *Server
	epfd   int
	wakefd int // an eventfd: stop
	stop   atomic.Bool
	done   chan struct{}
	load   atomic.Int64 // connections served, for placing new ones

	mu     sync.Mutex
	conns  map[int32]*conn // by descriptor
	kicked []*conn         // connections to read once they are in the loop (TLS: crypto/tls may hold records)

	// again: TLS connections whose records crypto/tls may still hold,
	// read again after the next wait (which then does not block).
	again []*conn

	events [128]unix.EpollEvent
	idle   bool // the last raw wait ended with nothing ready, or the last batch woke parked waiters: wait in the runtime's call
	// raw: the loop may wait by a raw system call, holding its P. Only
	// when the runtime has more Ps than there are loops: with none to
	// spare, everything else would wait for the loop's next event.
	raw  bool
	rbuf []byte // reads land here, then go to the frames they belong to
	// batch: the loop's goroutine keeps its thread, which runs under
	// SCHED_BATCH (evloop_sched.go); schedOff: a policy could not be set,
	// and is left as it is.
	batch, schedOff bool
	tid             atomic.Int64 // the thread kept while batch, else 0
}

// outLimit is how many reply bytes may wait for one connection before the
// loop stops reading its requests.
const outLimit = 1 << 20

// directRead is the part of a large frame still to come from which the
// loop reads straight into the frame's body instead of through rbuf.
const directRead = 32 << 10

// loopConn is a connection's state in its event loop.
type loopConn struct {
	loop *evLoop
	fd   int
	// TLS (evloop_tls.go): frames are read and written through tc, whose
	// sniffConn is in loop mode with state st; nil for a plain socket.
	tc *tls.Conn
	st *loopState
	// held: the connection's reading stopped before crypto/tls would
	// block (TLS: it may hold records epoll does not see), or with
	// requests read and not run (rest); the loop's goroutine only.
	held bool
	// queued: the connection is in its loop's again list, or in the
	// round's copy of it, not yet read (the loop's goroutine only): it is
	// put there once, however often its turn ends.
	queued bool
	// rest: bytes a read brought that feed did not take, because outLimit
	// bytes of replies were waiting (a pipelining client that does not
	// read); they are fed first when the output has drained (the loop's
	// goroutine only).
	rest []byte
	// lowat: a TCP socket's SO_RCVLOWAT as last set (0: never, the
	// kernel's 1); see setLowat.
	lowat int
	// ended is closed when the loop has let go of the connection.
	ended chan struct{}

	// The frame being read (the loop's goroutine only).
	hdr  [wire.HeaderSize]byte
	hn   int    // header bytes read
	n    uint32 // its body's length; 0 while reading a header
	body []byte
	got  int
	over bool  // n is over --max-frame: body holds the bytes its request id is in
	skip int64 // bytes of an oversized frame still to discard

	// Output (under conn.wmu).
	closed bool // the loop let go: nothing more is written
	// corked: the loop is running requests that one read brought together
	// (a pipelining client's); their replies wait in out and go in one
	// write when the read's requests have run (uncork).
	corked   bool
	out      []outChunk
	outBytes int
	// paused: a request of the connection runs off the loop (offLoop);
	// nothing more of it is read, or run, until that request is done.
	// detached: meanwhile its socket reported a hang-up or an error, which
	// epoll reports whatever the interest, so it is out of the epoll set
	// until then. afterOff: what letGo left to run once that request is
	// done (the undos of its replies: theirs come after its own).
	paused   bool
	detached bool
	afterOff func()
	interest uint32
	progress time.Time // the last write that moved output on
	stall    *time.Timer

	fmu      sync.Mutex // orders shutdown(2) before close(2)
	fdClosed bool
}

// outChunk is a reply waiting in a connection's output queue.
type outChunk struct {
	bufs [][]byte
	// plain: a large TLS reply's plaintext not sealed yet; bufs holds the
	// records of the piece sealed last (evloop_tls.go, sealNext).
	plain [][]byte
	fd    int        // a descriptor to pass with the first byte, or -1; owned by the chunk
	done  func(bool) // told whether the reply reached the socket; may be nil
}

// simple reports whether ch is bytes ready to write and nothing more: no
// descriptor to pass, no plaintext to seal.
func (ch *outChunk) simple() bool { return ch.fd < 0 && len(ch.plain) == 0 }

// eventLoops starts the server's event loops on first use.
func (s *Server) eventLoops() []*evLoop {
	s.loopsOnce.Do(func() {
		n := s.cfg.EventLoops
		if n <= 0 {
			n = max(1, runtime.GOMAXPROCS(0)/2)
		}
		raw := runtime.GOMAXPROCS(0) > n
		for range n {
			l, err := newEvLoop(s)
			if err != nil {
				s.log.Warn().Err(err).Msg("no event loop: serving each connection in a goroutine of its own")
				break
			}
			l.raw = raw
			s.loops = append(s.loops, l)
			go l.run()
		}
	})
	return s.loops
}

// stopLoops stops the event loops; connections still in one are ended.
func (s *Server) stopLoops() {
	s.loopsOnce.Do(func() {}) // none start after this
	for _, l := range s.loops {
		l.stop.Store(true)
		l.wake()
		<-l.done
	}
}

func newEvLoop(s *Server) (*evLoop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, os.NewSyscallError("eventfd", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wakefd)}); err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	return &evLoop{srv: s, epfd: epfd, wakefd: wakefd, done: make(chan struct{}), conns: make(map[int32]*conn),
		rbuf: make([]byte, 64<<10)}, nil
}

// loopsWanted reports whether c goes to an event loop now: a TCP one
// (plain or TLS) always, a Unix one once the daemon has EventLoopMinConns
// plain connections (unless loops are off). Below that, a Unix
// connection's own goroutine answers one client sooner: a loop's thread
// woken by one client alone is put on that client's CPU (a Unix socket's
// wake-up says the waker is about to sleep) and preempts it (measured: 15 %
// fewer calls/s from one process). Over TCP loopback a loop answered one
// client sooner than a goroutine did.
func (c *conn) loopsWanted() bool {
	s := c.srv
	return (c.plain || c.tls) && s.cfg.EventLoops >= 0 &&
		(c.transport == metrics.TransportTCP || s.plain.Load() >= int64(s.cfg.EventLoopMinConns))
}

// adopt moves c, a connection past its handshake and between two
// requests, out of the runtime's poller and into the least loaded event
// loop. It reports false (c unchanged) when there is none or c is closed.
func (c *conn) adopt() bool {
	tc, tsc := loopTLS(c.nc)
	var sc syscall.Conn
	if tsc != nil {
		sc = tsc.Conn.(syscall.Conn) // a *net.TCPConn (loopTLS)
	} else if sc, _ = c.nc.(syscall.Conn); sc == nil {
		return false
	}
	loops := c.srv.eventLoops()
	if len(loops) == 0 {
		return false
	}
	l := loops[0]
	for _, o := range loops[1:] {
		if o.load.Load() < l.load.Load() {
			l = o
		}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	c.wmu.Lock() // no reply is being written meanwhile
	fd := -1
	if err := rc.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || fd < 0 {
		c.wmu.Unlock()
		return false
	}
	// The copy shares the original's non-blocking open file; closing the
	// original takes it out of the runtime's poller. (A TLS connection's
	// socket, not its tls.Conn, which would send close_notify.)
	lp := &loopConn{loop: l, fd: fd, ended: make(chan struct{})}
	if tsc != nil {
		tsc.Conn.Close()
		lp.tc, lp.st = tc, tsc.enterLoop(fd)
	} else {
		c.nc.Close()
	}
	l.load.Add(1)
	c.lp.Store(lp)
	c.wmu.Unlock()
	if c.ctx.Err() != nil { // closed while it moved: close saw no loop
		lp.shut()
	}
	return true
}

// serveInLoop hands c to its loop and waits until the loop lets go of it,
// then closes its descriptor.
func (c *conn) serveInLoop() {
	lp := c.lp.Load()
	l := lp.loop
	l.mu.Lock()
	l.conns[int32(lp.fd)] = c
	l.mu.Unlock()
	c.wmu.Lock()
	lp.interest = unix.EPOLLIN | unix.EPOLLRDHUP
	err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, lp.fd, &unix.EpollEvent{Events: lp.interest, Fd: int32(lp.fd)})
	c.wmu.Unlock()
	if err != nil {
		c.log.Warn().Err(err).Msg("epoll_ctl add")
		l.mu.Lock()
		delete(l.conns, int32(lp.fd))
		l.mu.Unlock()
		lp.letGo(c)
	} else if lp.tc != nil {
		l.kick(c) // crypto/tls may hold records read before the move
	}
	<-lp.ended
	c.wmu.Lock()
	lp.closeFD()
	c.wmu.Unlock()
}

// closeFD closes the descriptor of a connection its loop has let go of, or
// that was adopted but never served, and takes it off its loop's load.
func (lp *loopConn) closeFD() {
	lp.loop.load.Add(-1)
	lp.fmu.Lock()
	lp.fdClosed = true
	unix.Close(lp.fd)
	lp.fmu.Unlock()
}

// shut shuts the socket down (both ways), which the loop reads as the end
// of the stream and ends the connection on.
func (lp *loopConn) shut() {
	lp.fmu.Lock()
	if !lp.fdClosed {
		_ = unix.Shutdown(lp.fd, unix.SHUT_RDWR)
	}
	lp.fmu.Unlock()
}

func (l *evLoop) run() {
	defer close(l.done)
	for {
		n, err := l.wait(len(l.again) > 0)
		if err != nil {
			l.srv.log.Error().Err(err).Msg("epoll_wait")
			time.Sleep(10 * time.Millisecond)
			continue
		}
		l.pace()
		woke := manager.Wakeups()
		again := l.again
		l.again = nil
		for i := range n {
			ev := l.events[i]
			if int(ev.Fd) == l.wakefd {
				if l.stop.Load() {
					l.endAll()
					return
				}
				for _, c := range l.takeKicked() {
					again = queueOnce(again, c)
				}
				continue
			}
			l.mu.Lock()
			c := l.conns[ev.Fd]
			l.mu.Unlock()
			if c == nil {
				continue
			}
			if ev.Events&unix.EPOLLOUT != 0 {
				if !l.flush(c) {
					continue
				}
				if c.lp.Load().held { // read again below, unless its output is backlogged still
					again = queueOnce(again, c)
				}
			}
			// A paused connection has no read interest (rearm); a hang-up
			// or an error it still reports takes it out of the set until
			// it resumes, when its requests still run and its end is seen.
			if ev.Events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 && c.lp.Load().detach(c) {
				continue
			}
			if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
				l.readable(c)
			}
		}
		for _, c := range again {
			lp := c.lp.Load()
			lp.queued = false
			select {
			case <-lp.ended:
				continue
			default:
			}
			if !lp.backlogged(c) {
				l.readable(c)
			}
		}
		// Requests that woke parked waiters (a release handing a Lock on,
		// a put handing an item to a parked get) made their goroutines
		// runnable on this loop's P. Under the raw wait that P stays marked
		// running, and another P takes a goroutine from a running P only
		// after polling it with sleeps (the runtime leaves a running P its
		// next goroutine for a while); in the runtime's own wait the P is
		// marked in a system call and they are taken at once.
		if manager.Wakeups() != woke {
			l.idle = true
		}
	}
}

// queueOnce appends c to again unless it is queued already (loopConn.queued).
func queueOnce(again []*conn, c *conn) []*conn {
	lp := c.lp.Load()
	if lp.queued {
		return again
	}
	lp.queued = true
	return append(again, c)
}

// wait returns the number of ready events. While requests keep coming it
// waits by a raw system call: the loop keeps its thread and its P, and the
// runtime neither hands the P on nor wakes its monitor thread, a context
// switch each. The raw wait has no timeout (a timer armed and cancelled
// per wait cost more than the rest of a short request's wait). The runtime
// interrupts it (EINTR) with the signal it preempts a goroutine with, sent
// when the loop has had its P for 10 ms and when the world is stopped, so a
// collection waits for the loop no longer than for any other goroutine.
// After such an interruption, and after a batch of requests that woke
// parked waiters (run), the loop counts as idle and waits once in a call
// the runtime knows may block, its P free for others meanwhile.
func (l *evLoop) wait(poll bool) (int, error) {
	if !l.idle && l.raw || poll {
		ms := rawWaitMS
		if poll {
			ms = 0
		}
		r1, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.epfd), uintptr(unsafe.Pointer(&l.events[0])),
			uintptr(len(l.events)), uintptr(ms), 0, 0)
		switch {
		case e == 0 && r1 > 0:
			return int(r1), nil
		case e == 0 || e == unix.EINTR:
			l.idle = !poll
			return 0, nil
		default:
			return 0, os.NewSyscallError("epoll_pwait", e)
		}
	}
	for {
		n, err := unix.EpollWait(l.epfd, l.events[:], -1)
		if err == unix.EINTR {
			continue
		}
		l.idle = false
		return n, err
	}
}

// rawWaitMS is the raw wait's timeout: none (-1), unless the runtime's
// asynchronous preemption is turned off (GODEBUG=asyncpreemptoff=1), when
// no signal would end the wait of an idle loop and 10 ms bounds how long
// a stop of the world can wait for it.
var rawWaitMS = func() int {
	if strings.Contains(os.Getenv("GODEBUG"), "asyncpreemptoff=1") {
		return 10
	}
	return -1
}()

// endAll ends every connection still in the loop (the server is stopping).
func (l *evLoop) endAll() {
	l.mu.Lock()
	cs := slices.Collect(maps.Values(l.conns))
	l.mu.Unlock()
	for _, c := range cs {
		l.end(c)
	}
}

// end takes c out of the loop: its output is dropped (each waiting reply's
// grant undone), it is closed, and its serve goroutine is let go on.
func (l *evLoop) end(c *conn) {
	lp := c.lp.Load()
	l.mu.Lock()
	if l.conns[int32(lp.fd)] != c {
		l.mu.Unlock()
		return
	}
	delete(l.conns, int32(lp.fd))
	l.mu.Unlock()
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, lp.fd, nil)
	lp.letGo(c)
}

// letGo marks lp closed, fails its waiting output and lets its serve
// goroutine go on.
func (lp *loopConn) letGo(c *conn) {
	c.wmu.Lock()
	lp.closed = true
	out := lp.out
	lp.out, lp.outBytes = nil, 0
	if lp.stall != nil {
		lp.stall.Stop()
	}
	c.wmu.Unlock()
	// Latest first: each undone get puts its item back at the head of its
	// queue, so the earliest must go back last. Off the loop: an undo waits
	// for its queue's ring latch for as long as a live client holds it
	// (evloop_offloop.go); the session ends after it (serve waits for pwg).
	release := func() {
		for i := len(out) - 1; i >= 0; i-- {
			out[i].release(false)
		}
	}
	switch {
	case len(out) == 0:
	case lp.afterOffLoop(c, release): // after the request that runs off the loop, which came last
	case c.addGoroutine():
		go func() {
			defer c.pwg.Done()
			release()
		}()
	default:
		release()
	}
	c.close()
	close(lp.ended)
}

func (ch *outChunk) release(ok bool) {
	if ch.fd >= 0 {
		unix.Close(ch.fd)
		ch.fd = -1
	}
	if ch.done != nil {
		ch.done(ok)
	}
}

// readable reads what c has sent and executes the requests completed by
// it. A plain socket is read once (a connection with more to read is
// reported again: every ready connection gets its turn); a TLS one until
// crypto/tls would block, or for one turn (tlsTurn, tlsTurnReads) and then
// again after the next wait (evloop_tls.go).
func (l *evLoop) readable(c *conn) {
	lp := c.lp.Load()
	lp.held = false
	if lp.st != nil {
		lp.st.newTurn()
	}
	if rest := lp.rest; rest != nil { // requests that waited for the output to drain go first
		lp.rest = nil
		if err := c.feed(rest); err != nil {
			c.readFailed(err)
			l.end(c)
			return
		}
		if lp.rest == nil && lp.backlogged(c) {
			// The last of them left the loop (offLoop), or left a
			// megabyte of replies: nothing more is read until then.
			l.hold(c)
			return
		}
	}
	for turn, reads := 0, 0; lp.rest == nil; reads++ {
		if c.ctx.Err() != nil {
			l.end(c)
			return
		}
		buf := l.rbuf
		direct := lp.n > 0 && !lp.over && int(lp.n)-lp.got >= directRead
		if direct {
			lp.grow()
			buf = lp.body[lp.got:]
		}
		n, err := lp.read(buf)
		if n > 0 {
			if ferr := c.took(buf[:n], direct); ferr != nil {
				c.readFailed(ferr)
				l.end(c)
				return
			}
		}
		if err == errWouldBlock {
			break
		}
		if err != nil {
			if err != io.EOF {
				c.log.Debug().Err(err).Msg("read failed")
			}
			l.end(c)
			return
		}
		if lp.tc == nil || lp.rest != nil {
			break // once per readiness; or with requests left to run
		}
		// A read that left records of crypto/tls's own (a KeyUpdate's
		// answer) to send ends the turn too: one Read may take up to 16
		// records that carry no data.
		turn += n
		if lp.backlogged(c) || turn >= tlsTurn || reads+1 >= tlsTurnReads || lp.keptToSend(c) {
			l.hold(c)
			break
		}
	}
	if lp.rest != nil {
		l.hold(c)
	}
	if lp.tc != nil {
		lp.sendKept(c)
	}
	if c.transport == metrics.TransportTCP { // (a Unix socket's readiness ignores SO_RCVLOWAT)
		lp.setLowat()
	}
}

// hold marks c as read again later: at the next round, or, while outLimit
// bytes of replies wait for it, once flush has drained them (run).
func (l *evLoop) hold(c *conn) {
	lp := c.lp.Load()
	lp.held = true
	if !lp.backlogged(c) {
		l.again = queueOnce(l.again, c)
	}
}

// setLowat has a TCP socket report readable only once lowatMax bytes (or
// the whole rest) of a large frame's body have arrived, as rawIO.expect
// does for a connection with a goroutine of its own: a TLS sender writes
// each 16 KiB record by itself, and the loop would be woken, read one
// record and wait again for each. The count is the body still to come,
// less what crypto/tls may hold of it (tlsHeld), which the socket will
// surely deliver before the peer waits for the daemon; once less than
// lowatMin is to come, the socket is set back to 1.
func (lp *loopConn) setLowat() {
	want := 1
	if lp.n > 0 && !lp.over {
		rest := int(lp.n) - lp.got
		if lp.tc != nil {
			rest -= tlsHeld
		}
		if rest >= lowatMin {
			want = min(rest, lowatMax)
		}
	}
	if want == max(lp.lowat, 1) {
		return
	}
	if unix.SetsockoptInt(lp.fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, want) == nil {
		lp.lowat = want
	}
}

// read reads c's next bytes into buf: a plain socket by one read(2), a TLS
// one through crypto/tls. It answers errWouldBlock when there is nothing.
func (lp *loopConn) read(buf []byte) (int, error) {
	if lp.tc != nil {
		return lp.tc.Read(buf)
	}
	return readNB(uintptr(lp.fd), buf)
}

// took takes p, bytes just read from c (straight into the frame's body when
// direct), and executes the requests they complete.
func (c *conn) took(p []byte, direct bool) error {
	if !direct {
		return c.feed(p)
	}
	lp := c.lp.Load()
	lp.got += len(p)
	if lp.got < int(lp.n) {
		return nil
	}
	return c.frameDone()
}

// kick has c's loop read c once it is in the loop, whether or not its
// socket is readable.
func (l *evLoop) kick(c *conn) {
	l.mu.Lock()
	l.kicked = append(l.kicked, c)
	l.mu.Unlock()
	l.wake()
}

// wake ends the loop's wait (its eventfd): to stop, or to read what was
// kicked.
func (l *evLoop) wake() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(l.wakefd, one[:])
}

// takeKicked clears the loop's eventfd and returns the connections kicked
// since the last call.
func (l *evLoop) takeKicked() []*conn {
	var b [8]byte
	_, _ = unix.Read(l.wakefd, b[:])
	l.mu.Lock()
	cs := l.kicked
	l.kicked = nil
	l.mu.Unlock()
	return cs
}

// grow makes room in lp.body for the next bytes of its frame: the body
// grows as it arrives (see wire.ReadBodyAsItArrives), so that a peer that
// announces a large frame and sends nothing costs nothing.
func (lp *loopConn) grow() {
	if lp.got < len(lp.body) {
		return
	}
	size := int(lp.n)
	if lp.over {
		size = min(size, wire.MaxIDPrefix)
	}
	next := size
	if lp.body == nil {
		if next > 1<<20+1<<18 {
			next = 1 << 20
		}
	} else if 2*len(lp.body)+len(lp.body)/2 < size {
		next = 2 * len(lp.body)
	}
	grown := make([]byte, next)
	copy(grown, lp.body[:lp.got])
	lp.body = grown
}

// feed takes p, bytes read from c, into the frames they belong to, and
// executes each request they complete. An error ends the connection.
func (c *conn) feed(p []byte) error {
	lp := c.lp.Load()
	corked := false
	for len(p) > 0 {
		if c.ctx.Err() != nil {
			return net.ErrClosed
		}
		if lp.skip > 0 {
			k := min(int64(len(p)), lp.skip)
			p, lp.skip = p[k:], lp.skip-k
			continue
		}
		if lp.n == 0 {
			k := copy(lp.hdr[lp.hn:], p)
			p, lp.hn = p[k:], lp.hn+k
			if lp.hn < wire.HeaderSize {
				return nil
			}
			lp.hn = 0
			n := binary.BigEndian.Uint32(lp.hdr[:])
			if n == 0 {
				return wire.ErrEmptyFrame
			}
			lp.n, lp.over, lp.got, lp.body = n, n > c.srv.cfg.MaxFrame, 0, nil
		}
		lp.grow()
		k := copy(lp.body[lp.got:], p)
		p, lp.got = p[k:], lp.got+k
		if lp.got < len(lp.body) || (!lp.over && lp.got < int(lp.n)) {
			continue
		}
		if len(p) > 0 && !corked { // more requests in this read: their replies go out together
			corked = true
			c.wmu.Lock()
			lp.corked = true
			c.wmu.Unlock()
			defer c.uncork()
		}
		if err := c.frameDone(); err != nil {
			return err
		}
		if len(p) > 0 && lp.backlogged(c) {
			// A client that pipelines and does not read: its next
			// requests wait, kept here, until its replies drain, so what
			// one read brings cannot make replies without bound (over TLS
			// each small one is sealed at once into a copy of its bytes).
			lp.rest = bytes.Clone(p)
			return nil
		}
	}
	return nil
}

// uncork ends what feed's cork began: the replies queued meanwhile are
// written, together, as far as the socket takes them.
func (c *conn) uncork() {
	lp := c.lp.Load()
	c.wmu.Lock()
	lp.corked = false
	queued := len(lp.out) > 0
	c.wmu.Unlock()
	if queued {
		lp.loop.flush(c)
	}
}

// frameDone executes the frame just read in full (or, for one over
// --max-frame, answers it too_large and skips the rest of it).
func (c *conn) frameDone() error {
	lp := c.lp.Load()
	body, n, over := lp.body[:lp.got], lp.n, lp.over
	lp.n, lp.body, lp.got, lp.over = 0, nil, 0, false
	if over {
		if err := c.answerOversized(n, body); err != nil {
			return err
		}
		lp.skip = int64(n) - int64(len(body))
		return nil
	}
	return c.execute(body)
}

// readFailed logs why reading c's requests stopped, answering a bad frame.
func (c *conn) readFailed(err error) {
	switch {
	case errors.Is(err, wire.ErrEmptyFrame), errors.Is(err, wire.ErrMalformed):
		c.log.Warn().Err(err).Msg("bad frame; closing")
		c.writeReply(0, &wire.Error{Code: wire.CodeBadRequest, Message: err.Error()}, nil)
	case errors.Is(err, errBadRequest), errors.Is(err, net.ErrClosed), c.ctx.Err() != nil:
	default:
		c.log.Debug().Err(err).Msg("read failed")
	}
}

// errBadRequest ends a connection whose request could not be decoded (it
// has been answered).
var errBadRequest = errors.New("malformed request")

// flush writes what waits in c's output queue, as far as the socket takes
// it. It reports false when the connection was ended.
func (l *evLoop) flush(c *conn) bool {
	lp := c.lp.Load()
	var done []outChunk
	c.wmu.Lock()
	if lp.closed {
		c.wmu.Unlock()
		return false
	}
	var failed error
	for sealed := 0; len(lp.out) > 0; {
		if ch := &lp.out[0]; len(ch.bufs) == 0 && len(ch.plain) > 0 {
			if sealed >= sealTurn {
				break // the socket is still writable: the loop comes back to it next round
			}
			n, err := lp.sealAhead(sealTurn - sealed)
			if err != nil {
				failed = err
				break
			}
			sealed += n
		}
		if len(lp.out) > 1 && lp.out[0].simple() && lp.out[1].simple() {
			// Replies with no descriptor to pass: as many as one writev takes.
			n, again, err := lp.writeChunks(&done)
			lp.wrote(n)
			if err != nil {
				failed = err
				break
			}
			if again {
				break // the socket takes nothing more now
			}
			continue
		}
		ch := &lp.out[0]
		fd := ch.fd
		n, err := writeOut(lp.fd, &ch.bufs, &ch.fd)
		if fd >= 0 && ch.fd < 0 { // passed: the chunk's copy is done with
			unix.Close(fd)
		}
		lp.wrote(n)
		if err != nil {
			failed = err
			break
		}
		if len(ch.bufs) > 0 {
			break
		}
		if len(ch.plain) > 0 {
			continue // its next piece
		}
		done = append(done, *ch)
		lp.out = lp.out[1:]
	}
	if failed == nil {
		lp.rearm(c)
	}
	c.wmu.Unlock()
	for i := range done {
		done[i].release(true)
	}
	if failed != nil {
		c.log.Debug().Err(failed).Msg("write failed")
		l.end(c)
		return false
	}
	return true
}

// wrote counts n bytes of the output queue written (under c.wmu).
func (lp *loopConn) wrote(n int) {
	lp.outBytes -= n
	if n > 0 {
		lp.progress = time.Now()
	}
}

// writeChunks writes the leading chunks of lp.out that pass no descriptor
// in one writev (up to maxIOV buffers), moves those written in full to
// *done, and leaves a partly written one at the head (under c.wmu).
func (lp *loopConn) writeChunks(done *[]outChunk) (n int, again bool, err error) {
	var all [][]byte
	for i := range lp.out {
		if !lp.out[i].simple() || i > 0 && len(all)+len(lp.out[i].bufs) > maxIOV {
			break
		}
		all = append(all, lp.out[i].bufs...)
	}
	n, again, errno := writevNB(uintptr(lp.fd), &all)
	left := n
	for len(lp.out) > 0 && lp.out[0].simple() {
		ch := &lp.out[0]
		size := 0
		for _, b := range ch.bufs {
			size += len(b)
		}
		if left < size {
			consume(&ch.bufs, left)
			break
		}
		left -= size
		ch.bufs = nil
		*done = append(*done, *ch)
		lp.out = lp.out[1:]
	}
	if errno != 0 {
		return n, false, os.NewSyscallError("writev", errno)
	}
	return n, again, nil
}

// rearm sets the events c's loop waits for to what its output needs
// (under c.wmu): writable while output waits; readable unless outLimit
// bytes wait. It also keeps the stall timer to the output's state.
func (lp *loopConn) rearm(c *conn) {
	var want uint32
	if !lp.paused { // (a paused connection's end is seen when it resumes)
		want = unix.EPOLLRDHUP
		if lp.outBytes < outLimit {
			want |= unix.EPOLLIN
		}
	}
	if len(lp.out) > 0 {
		want |= unix.EPOLLOUT
		if lp.stall == nil {
			lp.stall = time.AfterFunc(c.srv.cfg.WriteTimeout, func() { lp.stalled(c) })
		} else if lp.interest&unix.EPOLLOUT == 0 {
			lp.stall.Reset(c.srv.cfg.WriteTimeout)
		}
	} else if lp.stall != nil {
		lp.stall.Stop()
	}
	if want == lp.interest {
		return
	}
	lp.interest = want
	if lp.detached {
		return // (set when it resumes: offLoop)
	}
	if err := unix.EpollCtl(lp.loop.epfd, unix.EPOLL_CTL_MOD, lp.fd, &unix.EpollEvent{Events: want, Fd: int32(lp.fd)}); err != nil {
		c.log.Warn().Err(err).Msg("epoll_ctl mod")
	}
}

// stalled closes c when its output has not moved for WriteTimeout, the
// limit a blocked write has on a connection served by its own goroutine.
func (lp *loopConn) stalled(c *conn) {
	c.wmu.Lock()
	if lp.closed || len(lp.out) == 0 {
		c.wmu.Unlock()
		return
	}
	if left := c.srv.cfg.WriteTimeout - time.Since(lp.progress); left > 0 {
		lp.stall.Reset(left)
		c.wmu.Unlock()
		return
	}
	c.wmu.Unlock()
	c.log.Debug().Msg("client stopped reading its replies; closing")
	c.close()
}

// send writes bufs to c, passing fd (when >= 0) with their first byte. What
// the socket does not take at once waits in c's output queue, behind which
// every later reply waits too; done (when not nil) is told, now or later,
// whether the reply reached the socket. send fails only when c is closed or
// the write failed.
func (lp *loopConn) send(c *conn, bufs [][]byte, fd int, done func(bool)) error {
	c.wmu.Lock()
	var queued bool
	var err error
	if lp.tc != nil {
		queued, err = lp.sendTLSLocked(c, bufs, done)
	} else {
		queued, err = lp.sendLocked(c, bufs, fd, done)
	}
	c.wmu.Unlock()
	if queued {
		return nil
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		c.close()
	}
	if done != nil {
		done(err == nil)
	}
	return err
}

// sendLocked is send's part under c.wmu: it writes what the socket takes
// at once and queues the rest with done, reporting whether it queued (done
// is then told later, by flush or letGo).
func (lp *loopConn) sendLocked(c *conn, bufs [][]byte, fd int, done func(bool)) (queued bool, err error) {
	if lp.closed {
		return false, net.ErrClosed
	}
	if len(lp.out) == 0 && !lp.corked {
		if _, err := writeOut(lp.fd, &bufs, &fd); err != nil || len(bufs) == 0 {
			return false, err
		}
		lp.progress = time.Now()
	}
	ch := outChunk{bufs: append([][]byte(nil), bufs...), fd: -1, done: done}
	if fd >= 0 { // the caller's descriptor is its own: keep a copy
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return false, os.NewSyscallError("dup", err)
		}
		ch.fd = d
	}
	for _, b := range ch.bufs {
		lp.outBytes += len(b)
	}
	lp.out = append(lp.out, ch)
	if !lp.corked { // (uncork flushes, and rearms then)
		lp.rearm(c)
	}
	return true, nil
}

// writeOut writes bufs to the non-blocking socket fd until all is written
// or the socket would block, passing *passFD (when >= 0) with the first
// byte written and then setting it to -1. It returns the bytes written.
func writeOut(fd int, bufs *[][]byte, passFD *int) (int, error) {
	n := 0
	if *passFD >= 0 && len(*bufs) > 0 {
		k, err := unix.SendmsgBuffers(fd, *bufs, unix.UnixRights(*passFD), nil, unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN:
			return 0, nil
		case err != nil:
			return 0, os.NewSyscallError("sendmsg", err)
		}
		n = k
		consume(bufs, k)
		*passFD = -1
	}
	k, _, errno := writevNB(uintptr(fd), bufs)
	n += k
	if errno != 0 {
		return n, os.NewSyscallError("writev", errno)
	}
	return n, nil
}
