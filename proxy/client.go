package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/wire"
)

// Errors returned by the client. Errors the daemon answered are *wire.Error
// values (test them with errors.Is against the *wire.Error sentinels below,
// which compare codes); errors of the connection itself are ErrClosed and
// ErrConnectionLost, which no daemon answer ever is.
var (
	// ErrClosed: Close was called on the client.
	ErrClosed = errors.New("syncmgr: client closed")
	// ErrConnectionLost: the connection failed (read or write error, EOF,
	// a reply that could not be decoded, or the daemon ended it). What the
	// client held is released by the daemon.
	ErrConnectionLost = errors.New("syncmgr: connection lost")
	// ErrNoDaemon: Dial found no daemon listening at the address (no
	// socket file, or nobody accepting); the error says how to start one.
	ErrNoDaemon = errors.New("no syncmgr daemon is running")

	ErrEmpty        = &wire.Error{Code: wire.CodeEmpty}
	ErrFull         = &wire.Error{Code: wire.CodeFull}
	ErrNotOwner     = &wire.Error{Code: wire.CodeNotOwner}
	ErrKindMismatch = &wire.Error{Code: wire.CodeKindMismatch}
	ErrNoSuchObject = &wire.Error{Code: wire.CodeNoSuchObject}
	ErrShutdown     = &wire.Error{Code: wire.CodeShutdown}
	ErrTooLarge     = &wire.Error{Code: wire.CodeTooLarge}
	ErrBroken       = &wire.Error{Code: wire.CodeBroken}
	ErrDeleted      = &wire.Error{Code: wire.CodeDeleted}
	ErrCancelled    = &wire.Error{Code: wire.CodeCancelled}
	ErrLimit        = &wire.Error{Code: wire.CodeLimit}
	// ErrServerRestarted: the op named state got from an earlier run of
	// the daemon (a lock acquired before it restarted); nothing was done.
	ErrServerRestarted = &wire.Error{Code: wire.CodeServerRestarted}
	ErrAuthFailed      = auth.ErrAuthFailed
)

// outcome is what a pending call receives: the daemon's reply, or the
// connection's error.
type outcome struct {
	rep wire.Reply
	err error
	fds []int // descriptors passed with the reply (callFDs only)
}

// Option configures Dial.
type Option func(*options)

type options struct {
	tls       *tls.Config
	session   []byte
	label     string
	serverUID *int
	fast      bool
}

// WithServerUID accepts a Unix-socket server running as uid, besides our own
// uid and root (the default; see ErrServerUID).
func WithServerUID(uid int) Option { return func(o *options) { o.serverUID = &uid } }

// ErrServerUID: the process behind a Unix socket runs as another user than
// ours (or root). Another user could have put its own socket at the path
// (e.g. in a shared directory) to capture our handshake, so nothing is sent.
var ErrServerUID = errors.New("syncmgr: the server runs as another user")

// WithTLS wraps TCP connections in TLS.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithSession presents a session id, so that several clients of one process
// are one session to the server.
func WithSession(id []byte) Option { return func(o *options) { o.session = id } }

// WithLabel sets the label shown by `syncmgr status`.
func WithLabel(l string) Option { return func(o *options) { o.label = l } }

// Client is a connection to a syncmgr daemon.
type Client struct {
	nc   net.Conn
	info *auth.ServerInfo

	wmu sync.Mutex

	mu      sync.Mutex
	pending map[uint64]chan outcome
	nextID  uint64
	err     error // set once the connection is dead
	done    chan struct{}

	fast    *fastPath // the same-host fast path (fastpath.go); nil: socket only
	fastWhy string
	fdCalls map[uint64]bool // requests whose reply may carry descriptors (callFDs; under mu)
}

// ParseAddress splits "tcp://host:port", "unix:///path" or a bare path into
// a network and an address.
func ParseAddress(address string) (network, addr string) {
	switch {
	case strings.HasPrefix(address, "tcp://"):
		return "tcp", strings.TrimPrefix(address, "tcp://")
	case strings.HasPrefix(address, "unix://"):
		return "unix", strings.TrimPrefix(address, "unix://")
	default:
		return "unix", address
	}
}

// Dial connects and authenticates to the daemon at address.
//
// A refusal with code limit (the daemon's connection caps) and a
// connection the daemon drops during the handshake (its handshake budget
// is full) are tried again, after the daemon's retry hint or a short
// growing pause, until ctx's deadline (10 s when it has none); the last
// error is returned then. A wrong key is never tried again.
func Dial(ctx context.Context, address string, key []byte, opts ...Option) (*Client, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	pause := 10 * time.Millisecond
	for {
		c, err := dialOnce(ctx, address, key, &o, deadline)
		if err == nil || !retryable(err) {
			return c, err
		}
		wait := pause
		var re *auth.RefusedError
		if errors.As(err, &re) && re.RetryAfter > 0 {
			wait = min(re.RetryAfter, 5*time.Second)
		}
		pause = min(2*pause, 500*time.Millisecond)
		if time.Until(deadline) <= wait {
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// retryable says whether Dial tries again after err: a limit answer, or
// the daemon closing the connection during the handshake.
func retryable(err error) bool {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code == wire.CodeLimit
	}
	if errors.Is(err, auth.ErrAuthFailed) {
		return false
	}
	return errors.Is(err, errHandshakeDropped)
}

// errHandshakeDropped marks a connection closed by the daemon before the
// handshake ended.
var errHandshakeDropped = errors.New("the daemon closed the connection during the handshake (busy: too many connections waiting to authenticate, or stopping)")

// dropped marks err as errHandshakeDropped when the daemon closed the
// connection (EOF, reset).
func dropped(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%w: %w", errHandshakeDropped, err)
	}
	return err
}

// noDaemon is ErrNoDaemon, with the command that starts one, when dialling
// address failed with err because nothing listens there (no socket file,
// or a refused connection); nil for any other failure.
func noDaemon(address string, err error) error {
	if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	network, addr := ParseAddress(address)
	start := "syncmgr serve --socket " + addr
	if network == "tcp" {
		start = "syncmgr serve --tcp " + addr
	}
	return fmt.Errorf("%w at %s (%w): start one with `%s`, or set %s to a running daemon's address",
		ErrNoDaemon, address, err, start, EnvAddress)
}

// noReady holds the addresses of daemons that do not read a ready frame.
var noReady sync.Map

func dialOnce(ctx context.Context, address string, key []byte, o *options, deadline time.Time) (*Client, error) {
	network, addr := ParseAddress(address)
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		if nd := noDaemon(address, err); nd != nil {
			return nil, nd
		}
		return nil, fmt.Errorf("connect to syncmgr at %s: %w", address, err)
	}
	if uc, ok := nc.(*net.UnixConn); ok {
		if err := checkServerUID(uc, o.serverUID); err != nil {
			nc.Close()
			return nil, fmt.Errorf("connect to syncmgr at %s: %w", address, err)
		}
	}
	if network == "tcp" && o.tls != nil {
		cfg := o.tls
		if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
			cfg = cfg.Clone()
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("tls handshake with %s: %w", address, dropped(err))
		}
		nc = tc
	}
	_ = nc.SetDeadline(deadline)
	_, old := noReady.Load(address)
	info, err := auth.Client(nc, auth.ClientConfig{Key: key, Session: o.session, PID: os.Getpid(), Label: o.label, Ready: !old})
	if errors.Is(err, auth.ErrNoReady) {
		// A daemon older than the ready frame: once more without it.
		nc.Close()
		noReady.Store(address, true)
		return dialOnce(ctx, address, key, o, deadline)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("handshake with %s: %w", address, dropped(err))
	}
	_ = nc.SetDeadline(time.Time{})
	c := &Client{nc: nc, info: info, pending: make(map[uint64]chan outcome), done: make(chan struct{})}
	if o.fast {
		// Before the reader starts: the reply carries a descriptor.
		if err := c.attachFast(ctx, network); err != nil {
			nc.Close()
			return nil, fmt.Errorf("fast path attach with %s: %w", address, err)
		}
	}
	go c.readLoop()
	return c, nil
}

// checkServerUID checks with SO_PEERCRED that the listening process runs as
// our uid, root, or the uid allowed by WithServerUID.
func checkServerUID(uc *net.UnixConn, allowed *int) error {
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("read the server's credentials: %w", cerr)
	}
	uid := int(cred.Uid)
	if uid == os.Geteuid() || uid == 0 || allowed != nil && uid == *allowed {
		return nil
	}
	return fmt.Errorf("%w (uid %d, we are uid %d)", ErrServerUID, uid, os.Geteuid())
}

// Info returns what the handshake told about the server.
func (c *Client) Info() auth.ServerInfo { return *c.info }

// Close closes the connection; the server releases what this client held.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	return nil
}

// Done is closed when the connection is dead.
func (c *Client) Done() <-chan struct{} { return c.done }

func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	c.nc.Close()
	close(c.done)
	for _, ch := range pending {
		ch <- outcome{err: err}
	}
}

func (c *Client) readLoop() {
	var src io.Reader = c.nc
	rr := c.fdReader()
	if rr != nil {
		src = rr
	}
	for {
		body, err := wire.ReadFrame(src, c.info.MaxFrame+1024)
		fds := rr.take()
		if err != nil {
			closeFDs(fds)
			c.fail(fmt.Errorf("%w: %w", ErrConnectionLost, err))
			return
		}
		rep, err := wire.DecodeReply(body)
		if err != nil {
			closeFDs(fds)
			c.fail(fmt.Errorf("%w: bad reply: %w", ErrConnectionLost, err))
			return
		}
		if rep.ID == 0 {
			closeFDs(fds)
			if rep.Err != nil {
				c.fail(fmt.Errorf("%w: the daemon ended the connection: %w", ErrConnectionLost, rep.Err))
				return
			}
			continue
		}
		c.mu.Lock()
		ch := c.pending[rep.ID]
		delete(c.pending, rep.ID)
		if c.fdCalls[rep.ID] && ch != nil {
			delete(c.fdCalls, rep.ID)
		} else {
			closeFDs(fds) // nobody asked for them
			fds = nil
		}
		c.mu.Unlock()
		if ch != nil {
			ch <- outcome{rep: rep, fds: fds}
		}
	}
}

func (c *Client) send(id uint64, op string, args map[string]any) error {
	frame, err := wire.EncodeRequest(id, op, args)
	if err != nil {
		return fmt.Errorf("encode %s: %w", op, err)
	}
	if uint32(len(frame)-wire.HeaderSize) > c.info.MaxFrame {
		return &wire.Error{Code: wire.CodeTooLarge, Message: fmt.Sprintf("request of %d bytes is over the server's limit of %d", len(frame)-wire.HeaderSize, c.info.MaxFrame)}
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.nc.Write(frame); err != nil {
		c.fail(fmt.Errorf("%w: %w", ErrConnectionLost, err))
		return c.deadErr()
	}
	return nil
}

func (c *Client) deadErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Call sends a raw request and waits for its reply. When ctx ends first the
// request is cancelled on the server and Call waits for the answer, which
// is either "cancelled" or a result that raced in. A result that raced in is
// handed to undo, when not nil, and Call returns ctx's error: the caller
// sees an error and nothing happened. Without an undo (ops whose effect is
// public at once: put, barrier and condition waits) the result is returned
// as if ctx had not ended, since an error would misreport what happened.
func (c *Client) Call(ctx context.Context, op string, args map[string]any, undo func(any)) (any, error) {
	ch := make(chan outcome, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.send(id, op, args); err != nil {
		c.mu.Lock()
		if c.pending != nil {
			delete(c.pending, id)
		}
		c.mu.Unlock()
		return nil, err
	}
	select {
	case o := <-ch:
		return result(o)
	case <-ctx.Done():
	}
	_ = c.send(0, wire.OpCancel, map[string]any{wire.ArgID: id})
	o := <-ch // the reply, or the connection's error: fail answers every pending call
	res, err := result(o)
	switch {
	case err != nil:
		if o.err != nil {
			return nil, err
		}
		return nil, ctx.Err()
	case undo != nil:
		undo(res)
		return nil, ctx.Err()
	default:
		return res, nil
	}
}

func result(o outcome) (any, error) {
	if o.err != nil {
		return nil, o.err
	}
	if o.rep.Err != nil {
		return nil, o.rep.Err
	}
	return o.rep.Result, nil
}

// Notify sends a request that gets no reply (incref, decref, share).
func (c *Client) Notify(op string, args map[string]any) error {
	if err := c.deadErr(); err != nil {
		return err
	}
	return c.send(0, op, args)
}

// Ping makes one round trip.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.Call(ctx, wire.OpPing, nil, nil)
	return err
}

// Delete removes a named object; it reports whether it existed.
func (c *Client) Delete(ctx context.Context, name string) (bool, error) {
	res, err := c.Call(ctx, wire.OpDelete, map[string]any{wire.ArgName: name}, nil)
	b, _ := res.(bool)
	return b, err
}

// Status returns the server's status listing as decoded MessagePack.
func (c *Client) Status(ctx context.Context) (map[string]any, error) {
	res, err := c.Call(ctx, wire.OpStatus, nil, nil)
	if err != nil {
		return nil, err
	}
	m, ok := res.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("syncmgr: status: unexpected reply %T", res)
	}
	return m, nil
}
