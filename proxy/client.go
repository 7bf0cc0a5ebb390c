package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/wire"
)

// Errors returned by the client. Server errors are *wire.Error values; test
// them with errors.Is against these.
var (
	ErrClosed       = errors.New("syncmgr: client closed")
	ErrEmpty        = &wire.Error{Code: wire.CodeEmpty}
	ErrFull         = &wire.Error{Code: wire.CodeFull}
	ErrNotOwner     = &wire.Error{Code: wire.CodeNotOwner}
	ErrKindMismatch = &wire.Error{Code: wire.CodeKindMismatch}
	ErrNoSuchObject = &wire.Error{Code: wire.CodeNoSuchObject}
	ErrShutdown     = &wire.Error{Code: wire.CodeShutdown}
	ErrAuthFailed   = auth.ErrAuthFailed
)

// Option configures Dial.
type Option func(*options)

type options struct {
	tls     *tls.Config
	session []byte
	label   string
}

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
	pending map[uint64]chan wire.Reply
	nextID  uint64
	err     error // set once the connection is dead
	done    chan struct{}
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
func Dial(ctx context.Context, address string, key []byte, opts ...Option) (*Client, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	network, addr := ParseAddress(address)
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("connect to syncmgr at %s: %w", address, err)
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
			return nil, fmt.Errorf("tls handshake with %s: %w", address, err)
		}
		nc = tc
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	} else {
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	}
	info, err := auth.Client(nc, auth.ClientConfig{Key: key, Session: o.session, PID: os.Getpid(), Label: o.label})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("handshake with %s: %w", address, err)
	}
	_ = nc.SetDeadline(time.Time{})
	c := &Client{nc: nc, info: info, pending: make(map[uint64]chan wire.Reply), done: make(chan struct{})}
	go c.readLoop()
	return c, nil
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
		ch <- wire.Reply{Err: &wire.Error{Code: "connection", Message: err.Error()}}
	}
}

func (c *Client) readLoop() {
	for {
		body, err := wire.ReadFrame(c.nc, c.info.MaxFrame+1024)
		if err != nil {
			c.fail(fmt.Errorf("syncmgr: connection lost: %w", err))
			return
		}
		rep, err := wire.DecodeReply(body)
		if err != nil {
			c.fail(fmt.Errorf("syncmgr: bad reply: %w", err))
			return
		}
		if rep.ID == 0 {
			if rep.Err != nil {
				c.fail(fmt.Errorf("syncmgr: server closed the connection: %w", rep.Err))
				return
			}
			continue
		}
		c.mu.Lock()
		ch := c.pending[rep.ID]
		delete(c.pending, rep.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- rep
		}
	}
}

func (c *Client) send(id uint64, op string, args map[string]any) error {
	frame, err := wire.EncodeRequest(id, op, args)
	if err != nil {
		return fmt.Errorf("encode %s: %w", op, err)
	}
	if uint32(len(frame)-wire.HeaderSize) > c.info.MaxFrame {
		return &wire.Error{Code: wire.CodeTooLarge, Message: fmt.Sprintf("request of %d bytes is over the server's limit of %d", len(frame), c.info.MaxFrame)}
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.nc.Write(frame); err != nil {
		c.fail(fmt.Errorf("syncmgr: connection lost: %w", err))
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
// request is cancelled on the server; undo, if not nil, receives a result
// that raced in so the caller can give it back.
func (c *Client) Call(ctx context.Context, op string, args map[string]any, undo func(any)) (any, error) {
	ch := make(chan wire.Reply, 1)
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
	case rep := <-ch:
		return result(rep)
	case <-ctx.Done():
	}
	// Cancel on the server and wait for the answer, which is either
	// "cancelled" or a result that raced in.
	_ = c.send(0, "cancel", map[string]any{"id": id})
	select {
	case rep := <-ch:
		if res, err := result(rep); err == nil && undo != nil {
			undo(res)
		}
	case <-c.done:
	}
	return nil, ctx.Err()
}

func result(rep wire.Reply) (any, error) {
	if rep.Err != nil {
		if rep.Err.Code == "connection" {
			return nil, errors.New(rep.Err.Message)
		}
		return nil, rep.Err
	}
	return rep.Result, nil
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
	_, err := c.Call(ctx, "ping", nil, nil)
	return err
}

// Delete removes a named object; it reports whether it existed.
func (c *Client) Delete(ctx context.Context, name string) (bool, error) {
	res, err := c.Call(ctx, "delete", map[string]any{"name": name}, nil)
	b, _ := res.(bool)
	return b, err
}

// Status returns the server's status listing as decoded MessagePack.
func (c *Client) Status(ctx context.Context) (map[string]any, error) {
	res, err := c.Call(ctx, "status", nil, nil)
	if err != nil {
		return nil, err
	}
	m, ok := res.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("syncmgr: status: unexpected reply %T", res)
	}
	return m, nil
}
