package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/metrics"
	"github.com/syncmgr/syncmgr/wire"
)

// conn is one client connection.
type conn struct {
	srv  *Server
	nc   net.Conn
	id   uint64
	log  zerolog.Logger
	sess *manager.Session
	peer string // who the client is: "unix:uid:pid" or "tcp:address"; counted in srv.peerConns once set
	// sameUser: a Unix peer running as the daemon's own uid, the only one
	// given the fast path's memory (a descriptor passed with SCM_RIGHTS
	// bypasses the 0600 mode that would stop anyone else).
	sameUser bool

	ctx    context.Context // cancelled when the connection ends
	cancel context.CancelFunc

	transport string  // metrics.TransportUnix or metrics.TransportTCP
	cur       opLabel // the request dispatch is running; read by park in the same goroutine

	wmu sync.Mutex // serialises writes
	// wdl is the write deadline last set (under wmu): a reply refreshes it
	// only once half of WriteTimeout has gone, not with a timer change
	// per reply.
	wdl time.Time
	raw *rawIO // plain sockets served by their own goroutine: reads and writes by raw system calls (rawio.go)
	// lp: plain sockets served by an event loop (evloop.go). Set once,
	// under wmu, when the connection moves into a loop (at its handshake,
	// or between two requests once the daemon is busy); never unset.
	lp    atomic.Pointer[loopConn]
	plain bool // a Unix or plain TCP socket: one a loop can serve
	tls   bool // TLS over a TCP socket, which a loop can serve too (evloop_tls.go)

	pmu      sync.Mutex
	parked   map[uint64]*parkedReq
	draining bool           // set by drainParked: nothing more may park
	pwg      sync.WaitGroup // parked requests; Add only under pmu while !draining

	closeOnce sync.Once
}

func (s *Server) newConn(nc net.Conn) *conn {
	id := s.nextConn.Add(1)
	ctx, cancel := context.WithCancel(s.ctx)
	c := &conn{srv: s, nc: nc, id: id, ctx: ctx, cancel: cancel, parked: make(map[uint64]*parkedReq),
		transport: transportOf(nc), log: s.log.With().Uint64("conn", id).Logger()}
	switch nc.(type) {
	case *net.UnixConn, *net.TCPConn:
		c.plain = true
	default:
		_, sc := loopTLS(nc)
		c.tls = sc != nil
	}
	return c
}

// transportOf names the transport of nc for metrics.
func transportOf(nc net.Conn) string {
	if _, ok := nc.(*net.UnixConn); ok {
		return metrics.TransportUnix
	}
	return metrics.TransportTCP
}

// opLabel names a request for metrics and status: the kind of object it
// addresses ("server" for none), the op from the op table and the object's
// name. Kind and op come from the table, never from unchecked input.
type opLabel struct {
	kind, op, name string
}

// parkedReq is a request waiting in park.
type parkedReq struct {
	cancel context.CancelFunc
	label  opLabel
	since  time.Time
}

// Waiting describes a parked request for status listings.
type Waiting struct {
	Session uint64  `msgpack:"session"`
	Kind    string  `msgpack:"kind"`
	Name    string  `msgpack:"name"`
	Op      string  `msgpack:"op"`
	For     float64 `msgpack:"for"` // seconds
}

// result names the outcome of a request for metrics: "ok" or its error code.
func result(err error) string {
	if err == nil {
		return "ok"
	}
	return string(toWire(err).Code)
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		c.cancel()
		switch lp := c.lp.Load(); {
		case lp != nil:
			lp.shut()
		case c.tls:
			// The socket, not the tls.Conn: its Close sends close_notify
			// first, waiting up to 5 s for a client that does not read
			// (the very client a write timeout closes) while the session
			// holds on. A connection in a loop is shut down without one
			// too; clients see the end of the stream either way.
			c.nc.(*tls.Conn).NetConn().Close()
		default:
			c.nc.Close() // a move into a loop after this sees the cancelled context
		}
	})
}

// serve runs the connection: handshake, then the request loop. When it
// returns, parked requests are finished and the session is released.
func (c *conn) serve() {
	defer c.close()
	stop := context.AfterFunc(c.ctx, c.close) // a shutdown ends a handshake at once
	peer, err := c.handshake()
	stop()
	c.srv.unauth.Add(-1)
	c.srv.adm.leave(c)
	if err != nil {
		c.log.Debug().Err(err).Msg("handshake failed")
		c.countHandshakeFailure(err)
		return
	}
	// Only authenticated connections count against the peer's cap: an
	// unauthenticated one must not use up a client's share (over TCP they
	// may share a source address).
	if !c.srv.reservePeer(c.peer) {
		c.srv.cfg.Metrics.Refused(c.transport, "max_conns_per_client")
		c.writeReply(0, wire.Errorf(wire.CodeLimit, "too many connections from this client (--max-conns-per-client)"), nil)
		return
	}
	defer c.srv.releasePeer(c.peer)
	sess, err := c.srv.mgr.OpenSessionFrom(c.peer, peer.Session, peer.PID, peer.Label)
	if err != nil {
		c.writeReply(0, toWire(err), nil)
		return
	}
	c.sess = sess
	if c.plain {
		c.srv.plain.Add(1)
		defer c.srv.plain.Add(-1)
	}
	inLoop := c.loopsWanted() && c.adopt()
	if !c.srv.track(c, true) {
		if inLoop {
			c.lp.Load().closeFD()
		}
		c.srv.mgr.CloseSession(sess)
		return
	}
	c.srv.authed.Add(1)
	c.srv.cfg.Metrics.ConnOpened(c.transport)
	c.log.Debug().Uint64("session", sess.ID).Int("pid", peer.PID).Str("label", peer.Label).Msg("client connected")
	defer func() {
		c.close()
		c.pwg.Wait() // every parked request has undone what it could not deliver
		c.srv.mgr.CloseSession(sess)
		c.srv.authed.Add(-1)
		c.srv.cfg.Metrics.ConnClosed(c.transport)
		c.srv.track(c, false)
		c.log.Debug().Uint64("session", sess.ID).Msg("client disconnected")
	}()
	if inLoop {
		c.serveInLoop()
	} else {
		c.loop()
	}
}

func (c *conn) handshake() (*auth.Peer, error) {
	key, err := c.checkPeer()
	if err != nil {
		c.log.Warn().Err(err).Msg("refused connection")
		return nil, &refusal{"peer_uid", err}
	}
	c.peer = key
	if c.srv.peerFull(key) { // refused before the challenge: it costs nothing
		c.writeHandshakeError(wire.CodeLimit, "too many connections from this client (--max-conns-per-client)")
		return nil, &refusal{"max_conns_per_client", errors.New("too many connections from this client")}
	}
	if c.srv.authed.Load() >= int64(c.srv.cfg.MaxConns) {
		c.writeHandshakeError(wire.CodeLimit, "too many connections")
		return nil, &refusal{"max_conns", errors.New("too many connections")}
	}
	_ = c.nc.SetDeadline(time.Now().Add(c.srv.cfg.HandshakeTimeout))
	peer, err := auth.Server(c.srv.adm.watch(c), auth.ServerConfig{Key: c.srv.cfg.Key, MaxFrame: c.srv.cfg.MaxFrame,
		Server: "syncmgr " + Version, BootID: c.srv.bootID, PID: os.Getpid(), ConnID: c.id, RunID: c.srv.runID,
		Penalty: func() { c.srv.adm.penalty(c) }})
	if err != nil {
		var he *auth.HandshakeError
		if errors.As(err, &he) && he.Code == wire.CodeAuthFailed {
			c.srv.adm.logRefusal("authentication failed", c.nc.RemoteAddr().String())
		}
		return nil, err
	}
	_ = c.nc.SetDeadline(time.Time{})
	return peer, nil
}

// refusal is a connection turned away before its handshake, with the reason
// metrics count it under.
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// countHandshakeFailure counts a connection that did not complete its
// handshake: a refusal by its reason, else a failure as "auth" (wrong key),
// "timeout" or "protocol" (anything else the peer got wrong).
func (c *conn) countHandshakeFailure(err error) {
	var r *refusal
	var he *auth.HandshakeError
	var ne net.Error
	switch {
	case errors.As(err, &r):
		c.srv.cfg.Metrics.Refused(c.transport, r.reason)
	case errors.As(err, &he) && he.Code == wire.CodeAuthFailed:
		c.srv.cfg.Metrics.HandshakeFailed(c.transport, "auth")
	case errors.As(err, &ne) && ne.Timeout():
		c.srv.cfg.Metrics.HandshakeFailed(c.transport, "timeout")
	default:
		c.srv.cfg.Metrics.HandshakeFailed(c.transport, "protocol")
	}
}

// writeHandshakeError answers a connection refused before its challenge.
// A limit answer carries a retry hint (clients retry within their connect
// timeout). What the client sent first (its ready frame) is read away, so
// that closing does not reset the connection under the answer.
func (c *conn) writeHandshakeError(code wire.Code, msg string) {
	em := auth.ErrorMsg{T: "error", Code: string(code), Message: msg}
	if code == wire.CodeLimit {
		em.RetryAfter = limitRetryAfter.Seconds()
	}
	b, err := wire.Marshal(em)
	if err == nil {
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		_ = wire.WriteFrame(c.nc, b)
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.nc, wire.HandshakeMaxFrame))
}

// limitRetryAfter is the hint sent with a limit answer in the handshake.
const limitRetryAfter = 100 * time.Millisecond

// checkPeer names the client for per-client caps and refuses Unix peers
// running as another user unless allowed. A Unix peer is its uid and pid
// (SO_PEERCRED: reconnecting does not make a new client); a TCP peer is its
// source address without the port.
func (c *conn) checkPeer() (string, error) {
	uc, ok := c.nc.(*net.UnixConn)
	if !ok {
		addr := c.nc.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(addr); err == nil {
			addr = host
		}
		return "tcp:" + addr, nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return "", err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return "", err
	}
	if cerr != nil {
		return "", cerr
	}
	if uid := uint32(os.Getuid()); !c.srv.cfg.AllowOtherUsers && cred.Uid != uid && cred.Uid != 0 {
		c.writeHandshakeError(wire.CodeAuthFailed, "peer runs as another user")
		return "", errors.New("peer uid differs from the server's (see --allow-other-users)")
	}
	c.sameUser = cred.Uid == uint32(os.Geteuid())
	return fmt.Sprintf("unix:%d:%d", cred.Uid, cred.Pid), nil
}

func (c *conn) loop() {
	var src io.Reader = c.nc
	if c.raw = newRawIO(c.nc); c.raw != nil {
		src = c.raw
	}
	br := bufio.NewReaderSize(src, 64<<10)
	// The socket under the frames, told how much of a large body is still
	// to come (rawIO.expect), less what crypto/tls may hold of it.
	under, held := c.raw, 0
	if under == nil {
		under, held = tlsRecords(c.nc), tlsHeld
	}
	for {
		n, err := wire.ReadHeader(br)
		if err == nil && n > c.srv.cfg.MaxFrame {
			err = c.skipOversized(br, n)
			if err == nil {
				continue
			}
		}
		var body []byte
		if err == nil {
			if under != nil {
				under.expect(int(n) - br.Buffered() - held)
			}
			body, err = wire.ReadBodyAsItArrives(br, n)
			if under != nil {
				under.expect(0)
			}
		}
		if err == nil {
			err = c.execute(body)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				c.readFailed(err)
			}
			return
		}
		// Between two requests, with nothing of the next read yet: once
		// the daemon is busy, the loops serve this connection from here on.
		if br.Buffered() == 0 && c.loopsWanted() && c.adopt() {
			c.serveInLoop()
			return
		}
	}
}

// execute decodes one request and runs it. A request that cannot be
// decoded is answered bad_request, and ends the connection (errBadRequest).
func (c *conn) execute(body []byte) error {
	req, err := wire.DecodeRequest(body)
	if err != nil {
		c.log.Warn().Err(err).Msg("malformed request; closing")
		c.writeReply(0, &wire.Error{Code: wire.CodeBadRequest, Message: err.Error()}, nil)
		return errBadRequest
	}
	c.dispatch(&req)
	return nil
}

// skipOversized answers a frame of n bytes, over the limit, with too_large
// and reads its body into the void, so that the stream stays in step and
// the connection (and what its session holds) lives on. The reply names the
// request id read from the body's first bytes; a body whose id cannot be
// read is answered with id 0 and ends the connection (ErrMalformed).
func (c *conn) skipOversized(br *bufio.Reader, n uint32) error {
	head := make([]byte, min(n, wire.MaxIDPrefix))
	if _, err := io.ReadFull(br, head); err != nil {
		return err
	}
	if err := c.answerOversized(n, head); err != nil {
		return err
	}
	_, err := io.CopyN(io.Discard, br, int64(n)-int64(len(head)))
	return err
}

// answerOversized answers a frame of n bytes, over the limit, whose first
// bytes are head.
func (c *conn) answerOversized(n uint32, head []byte) error {
	msg := fmt.Sprintf("request of %d bytes is over the server's limit of %d (--max-frame)", n, c.srv.cfg.MaxFrame)
	id, err := wire.PeekRequestID(head)
	if err != nil {
		c.writeReply(0, &wire.Error{Code: wire.CodeTooLarge, Message: msg}, nil)
		return fmt.Errorf("%w: oversized frame without a readable request id", wire.ErrMalformed)
	}
	c.log.Debug().Uint32("size", n).Uint64("id", id).Msg("oversized request skipped")
	if id != 0 {
		return c.writeReply(id, &wire.Error{Code: wire.CodeTooLarge, Message: msg}, nil)
	}
	return nil
}

func (c *conn) dispatch(req *wire.Request) {
	if c.srv.closing.Load() {
		c.reply(req.ID, nil, manager.ErrShutdown)
		return
	}
	if run, ok := req.Args.Lookup(wire.ArgRun); ok && run != c.srv.runID {
		// State got under an earlier run is gone; acting on whatever now
		// has the same name (a lock someone else holds) would be wrong.
		c.reply(req.ID, nil, wire.Errorf(wire.CodeServerRestarted,
			"the daemon restarted since this state was acquired (run %v, now %s); it was lost", run, c.srv.runID))
		return
	}
	o, err := c.srv.ops.find(req)
	if err != nil {
		c.reply(req.ID, nil, err)
		c.srv.cfg.Metrics.Op("unknown", "unknown", result(err))
		return
	}
	c.cur = opLabel{kind: o.kind, op: o.name}
	c.cur.name, _ = req.Args.Get(wire.ArgName).(string)
	if c.lp.Load() != nil && c.leavesLoop(o, req.Args) && c.offLoop(func() { c.run(o, req) }) { // (evloop_offloop.go)
		return
	}
	c.run(o, req)
}

// run executes o, the op req names, and answers it (or parks it).
func (c *conn) run(o *op, req *wire.Request) {
	if o.fn != nil {
		res, err := o.fn(c, req.ID, req.Args)
		c.reply(req.ID, res, err)
		c.srv.cfg.Metrics.Op(c.cur.kind, c.cur.op, result(err))
		return
	}
	res, g, err := o.grant(c, req.ID, req.Args)
	switch {
	case err == errParked: // counted when park answers it
	case err != nil:
		c.reply(req.ID, nil, err)
		c.srv.cfg.Metrics.Op(c.cur.kind, c.cur.op, result(err))
	default:
		c.deliver(req.ID, res, g, c.cur)
	}
}

// deliver writes the reply of a granting op and commits its grant, or
// undoes the grant when nobody is left to receive the reply or it could not
// be written. This is the only place the socket transport commits or undoes
// a grant: no handler writes an undo of its own.
// A reply that waits in an event loop's output queue (evloop.go) keeps its
// grant until it is written. The outcome is counted for metrics under
// label: "ok" or "undone".
func (c *conn) deliver(id uint64, res any, g manager.Grant, label opLabel) {
	m := c.srv.cfg.Metrics
	settle := func(written bool) {
		if written {
			g.Commit()
			m.Op(label.kind, label.op, "ok")
		} else {
			g.Undo()
			m.Op(label.kind, label.op, "undone")
		}
	}
	switch {
	case id == 0: // the client asked for no reply: the effect stands
		settle(true)
	case c.ctx.Err() != nil:
		settle(false)
	default:
		_ = c.writeReplyThen(id, nil, res, settle)
	}
}

// reply answers request id; it fails when the reply could not be written.
func (c *conn) reply(id uint64, res any, err error) error {
	if id == 0 {
		if err != nil {
			c.log.Debug().Err(err).Msg("error in a request without reply")
		}
		return nil
	}
	var we *wire.Error
	if err != nil {
		we = toWire(err)
		if we.Code == wire.CodeInternal {
			c.log.Error().Err(err).Msg("internal error")
		}
	}
	return c.writeReply(id, we, res)
}

// largeReply is the size from which a bin result (or a list of them, in
// all) is written with writev after its header instead of being copied
// into the reply frame.
const largeReply = 32 << 10

// writeReply writes one reply frame. A failed write closes the connection:
// the stream cannot be trusted after a partial frame.
func (c *conn) writeReply(id uint64, we *wire.Error, res any) error {
	return c.writeReplyThen(id, we, res, nil)
}

// writeReplyThen writes one reply frame and tells done (when not nil)
// whether it reached the socket; see write.
func (c *conn) writeReplyThen(id uint64, we *wire.Error, res any, done func(bool)) error {
	if fr, ok := res.(fdReply); ok {
		if we == nil && c.transport != metrics.TransportUnix {
			we = &wire.Error{Code: wire.CodeUnknownOp, Message: "descriptors pass only over a Unix socket"}
		}
		if we != nil {
			return c.writeReplyThen(id, we, nil, done)
		}
		frame, err := wire.EncodeReply(id, nil, fr.res)
		if err != nil {
			c.log.Error().Err(err).Msg("encode reply")
			return c.writeReplyThen(id, &wire.Error{Code: wire.CodeInternal, Message: "cannot encode reply"}, nil, done)
		}
		return c.write(net.Buffers{frame}, fr.fd, done)
	}
	var bufs net.Buffers
	if we == nil {
		switch r := res.(type) {
		case []byte:
			if len(r) >= largeReply {
				if head, err := wire.EncodeBinReplyHead(id, len(r)); err == nil {
					bufs = net.Buffers{head, r}
				}
			}
		case [][]byte: // get_many's items
			if binsSize(r) >= largeReply {
				if pieces, err := wire.EncodeBinsReply(id, r); err == nil {
					bufs = pieces
				}
			}
		}
	}
	if bufs == nil {
		frame, err := wire.EncodeReply(id, we, res)
		if err != nil {
			c.log.Error().Err(err).Msg("encode reply")
			frame, _ = wire.EncodeReply(id, &wire.Error{Code: wire.CodeInternal, Message: "cannot encode reply"}, nil)
		}
		bufs = net.Buffers{frame}
	}
	return c.write(bufs, -1, done)
}

// write writes one reply's bytes, passing the descriptor fd (when >= 0,
// over a Unix socket only) with its first byte, and tells done (when not
// nil) whether they reached the socket. A connection served by its own
// goroutine writes before it returns (a failed write, or one not done
// within WriteTimeout, closes the connection); one in an event loop may
// queue the bytes behind its socket and tell done later (evloop.go).
func (c *conn) write(bufs net.Buffers, fd int, done func(bool)) error {
	if lp := c.lockWrites(); lp != nil {
		return lp.send(c, bufs, fd, done)
	}
	c.refreshWriteDeadline()
	var err error
	switch {
	case fd >= 0:
		err = c.writeWithFD(bufs, fd)
	case c.raw != nil:
		err = c.raw.writeBuffers(bufs)
	default:
		_, err = bufs.WriteTo(c.nc)
	}
	if err != nil {
		c.close()
	}
	c.wmu.Unlock()
	if done != nil {
		done(err == nil)
	}
	return err
}

func binsSize(items [][]byte) (n int) {
	for _, it := range items {
		n += len(it)
	}
	return n
}

// refreshWriteDeadline keeps the write deadline at least half of
// WriteTimeout ahead (under wmu): a client that stops reading still has its
// connection closed within WriteTimeout of a write that cannot finish.
func (c *conn) refreshWriteDeadline() {
	now := time.Now()
	if c.wdl.Sub(now) >= c.srv.cfg.WriteTimeout/2 {
		return
	}
	c.wdl = now.Add(c.srv.cfg.WriteTimeout)
	_ = c.nc.SetWriteDeadline(c.wdl)
}

// lockWrites takes wmu for a connection served by its own goroutine and
// returns nil; for one served by a loop (or moved into one while wmu was
// awaited) it holds nothing and returns its loop state, whose send takes
// wmu itself.
func (c *conn) lockWrites() *loopConn {
	if lp := c.lp.Load(); lp != nil {
		return lp
	}
	c.wmu.Lock()
	if lp := c.lp.Load(); lp != nil {
		c.wmu.Unlock()
		return lp
	}
	return nil
}

// writeWithFD writes bufs with fd attached (SCM_RIGHTS), under wmu: the
// kernel delivers the descriptor with the first bytes, to a client reading
// them with recvmsg. Only on a Unix socket.
func (c *conn) writeWithFD(bufs net.Buffers, fd int) error {
	uc, ok := c.nc.(*net.UnixConn)
	if !ok {
		return errors.New("descriptors pass only over a Unix socket")
	}
	frame := bytes.Join(bufs, nil)
	n, _, err := uc.WriteMsgUnix(frame, unix.UnixRights(fd), nil)
	if err == nil && n < len(frame) {
		_, err = c.nc.Write(frame[n:]) // the descriptor went with the first bytes
	}
	return err
}

// park runs wait in a goroutine of its own and delivers its result when it
// ends (see deliver): a grant nobody can receive is undone.
func (c *conn) park(id uint64, wait waitFunc) error {
	ctx, cancel := context.WithCancel(c.ctx)
	c.pmu.Lock()
	if c.draining {
		c.pmu.Unlock()
		cancel()
		return manager.ErrShutdown
	}
	label := c.cur
	if id != 0 {
		if _, dup := c.parked[id]; dup {
			c.pmu.Unlock()
			cancel()
			return wire.Errorf(wire.CodeBadRequest, "request id %d is already in flight", id)
		}
	}
	if n := c.sess.Parked.Add(1); n > c.srv.cfg.MaxParked {
		c.sess.Parked.Add(-1)
		c.pmu.Unlock()
		cancel()
		return fmt.Errorf("%w: this client has %d requests waiting (--max-parked)", manager.ErrLimit, n-1)
	}
	if id != 0 {
		c.parked[id] = &parkedReq{cancel: cancel, label: label, since: time.Now()}
	}
	c.pwg.Add(1)
	c.pmu.Unlock()
	go func() {
		defer c.pwg.Done()
		defer c.sess.Parked.Add(-1)
		res, g, err := wait(ctx)
		c.pmu.Lock()
		if id != 0 {
			delete(c.parked, id)
		}
		c.pmu.Unlock()
		cancel()
		if err != nil {
			c.reply(id, nil, err)
			c.srv.cfg.Metrics.Op(label.kind, label.op, result(err))
			return
		}
		c.deliver(id, res, g, label)
	}()
	return errParked
}

// waiting lists the connection's parked requests.
func (c *conn) waiting(now time.Time, out []Waiting) []Waiting {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	for _, p := range c.parked {
		out = append(out, Waiting{Session: c.sess.ID, Kind: p.label.kind, Name: p.label.name, Op: p.label.op,
			For: now.Sub(p.since).Seconds()})
	}
	return out
}

// cancelParked cancels the parked request id, if any.
func (c *conn) cancelParked(id uint64) {
	c.pmu.Lock()
	p := c.parked[id]
	c.pmu.Unlock()
	if p != nil {
		p.cancel()
	}
}

// shutdownNotice is the unasked reply every connection gets before a
// graceful shutdown closes it.
var shutdownNotice = &wire.Error{Code: wire.CodeShutdown, Message: "the syncmgr daemon is shutting down"}

// notifyShutdown writes shutdownNotice, waiting at most noticeTimeout for a
// client that does not read: the notice is a courtesy, the close is what
// counts.
func (c *conn) notifyShutdown() {
	frame, err := wire.EncodeReply(0, shutdownNotice, nil)
	if err != nil {
		return
	}
	if lp := c.lockWrites(); lp != nil { // queued behind what the socket has not taken, if need be
		_ = lp.send(c, net.Buffers{frame}, -1, nil)
		return
	}
	defer c.wmu.Unlock()
	c.wdl = time.Now().Add(noticeTimeout)
	_ = c.nc.SetWriteDeadline(c.wdl)
	_, _ = c.nc.Write(frame)
}

// noticeTimeout bounds the shutdown notice's write.
const noticeTimeout = 100 * time.Millisecond

// drainParked waits until every parked request has been answered. Requests
// that would park after it started are answered shutting_down instead, so
// that no pwg.Add races with its Wait.
func (c *conn) drainParked(ctx context.Context) {
	c.pmu.Lock()
	c.draining = true
	c.pmu.Unlock()
	done := make(chan struct{})
	go func() { c.pwg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
