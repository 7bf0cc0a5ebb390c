package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
	"github.com/syncmgr/syncmgr/wire"
)

func TestCancelOp(t *testing.T) {
	ts := startServer(t)
	holder := ts.dial(t)
	call(t, holder, "create", obj("lock", "L"))
	call(t, holder, "acquire", obj("lock", "L"))
	call(t, holder, "create", obj("queue", "Q"))

	r := ts.raw(t, nil)
	r.send(5, "acquire", obj("lock", "L", "tid", 1))
	r.send(6, "get", obj("queue", "Q"))
	ts.waitWaiters(t, "lock", "L", 1)
	ts.waitWaiters(t, "queue", "Q", 1)
	r.send(0, "cancel", map[string]any{"id": 5})
	rep := r.recv()
	if rep.ID != 5 || rep.Err == nil || rep.Err.Code != wire.CodeCancelled {
		t.Fatalf("cancelled acquire answered %+v", rep)
	}
	r.send(0, "cancel", map[string]any{"id": 5})   // already answered: ignored
	r.send(0, "cancel", map[string]any{"id": 999}) // unknown: ignored
	r.send(0, "cancel", map[string]any{"id": "x"}) // malformed, id 0: no answer
	r.send(0, "cancel", map[string]any{"id": 6})   // the get
	if rep := r.recv(); rep.ID != 6 || rep.Err == nil || rep.Err.Code != wire.CodeCancelled {
		t.Fatalf("cancelled get answered %+v", rep)
	}
	r.send(7, "ping", nil)
	if rep := r.recv(); rep.ID != 7 || rep.Err != nil {
		t.Fatalf("ping after cancels: %+v", rep)
	}
	ts.waitWaiters(t, "lock", "L", 0)
	call(t, holder, "release", obj("lock", "L"))
	if call(t, holder, "acquire", obj("lock", "L", "block", false)) != true {
		t.Fatal("the cancelled waiter took the lock")
	}
	call(t, holder, "put", obj("queue", "Q", "item", []byte("x")))
	if got := call(t, holder, "qsize", obj("queue", "Q")); got != int64(1) {
		t.Fatalf("the cancelled getter took the item: qsize %v", got)
	}
}

// TestCancelThroughClient: a context cancelled in the Go client cancels the
// parked request; a grant that raced in is given back.
func TestCancelThroughClient(t *testing.T) {
	ts := startServer(t)
	holder, waiter := ts.dial(t), ts.dial(t)
	ctx := ctxT(t)
	lh, _ := holder.Lock(ctx, "L")
	lw, _ := waiter.Lock(ctx, "L")
	for i := 0; i < 30; i++ {
		if err := lh.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx) // no deadline: the server waits until cancel
		errc := make(chan error, 1)
		go func() { errc <- lw.Acquire(wctx) }()
		ts.waitWaiters(t, "lock", "L", 1)
		together(cancel, func() { lh.Release(ctx) })
		err := <-errc
		if err == nil {
			lw.Release(ctx)
		} else if !errors.Is(err, context.Canceled) {
			t.Fatalf("iteration %d: %v", i, err)
		}
		// Whatever happened, the lock ends up free (a raced grant is given
		// back by the client).
		if ok, err := lh.AcquireTimeout(ctx, 2*time.Second); !ok || err != nil {
			t.Fatalf("iteration %d: lock not free: %v %v", i, ok, err)
		}
		lh.Release(ctx)
	}
}

// disconnectCase parks a request of a client that then disconnects.
type disconnectCase struct {
	name  string
	setup func(t *testing.T, c *proxy.Client)                                   // by the other client
	park  func(r *rawConn)                                                      // by the leaving client
	obj   [2]string                                                             // kind and name to watch
	grant func(t *testing.T, c *proxy.Client)                                   // releases or puts
	check func(t *testing.T, next *proxy.Client, delivered bool, iteration int) // the next client gets it
}

func disconnectCases() []disconnectCase {
	acq := func(kind string, kv ...any) disconnectCase {
		return disconnectCase{
			name: kind,
			setup: func(t *testing.T, c *proxy.Client) {
				call(t, c, "create", obj(kind, "X", kv...))
				call(t, c, "acquire", obj(kind, "X", "tid", 1))
			},
			park: func(r *rawConn) { r.send(1, "acquire", obj(kind, "X", "tid", 1)) },
			obj:  [2]string{kind, "X"},
			grant: func(t *testing.T, c *proxy.Client) {
				if err := callErr(c, "release", obj(kind, "X", "tid", 1)); err != nil {
					t.Errorf("release: %v", err)
				}
			},
			check: func(t *testing.T, next *proxy.Client, _ bool, i int) {
				// Delivered or not, the leaving session ended: it is free.
				if res := call(t, next, "acquire", obj(kind, "X", "tid", 3, "timeout", 3)); res != true {
					t.Fatalf("iteration %d: the next client did not get the %s", i, kind)
				}
				call(t, next, "release", obj(kind, "X", "tid", 3))
			},
		}
	}
	return []disconnectCase{
		acq("lock"),
		acq("rlock"),
		acq("semaphore", "value", 1),
		acq("bounded_semaphore", "value", 1),
		{
			name:  "get",
			setup: func(t *testing.T, c *proxy.Client) { call(t, c, "create", obj("queue", "X")) },
			park:  func(r *rawConn) { r.send(1, "get", obj("queue", "X")) },
			obj:   [2]string{"queue", "X"},
			grant: func(t *testing.T, c *proxy.Client) {
				if err := callErr(c, "put", obj("queue", "X", "item", []byte("precious"))); err != nil {
					t.Errorf("put: %v", err)
				}
			},
			check: func(t *testing.T, next *proxy.Client, delivered bool, i int) {
				if delivered { // the reply reached the client before it left
					if err := callErr(next, "get", obj("queue", "X", "timeout", 0.05)); code(err) != wire.CodeEmpty {
						t.Fatalf("iteration %d: item delivered and still in the queue: %v", i, err)
					}
					return
				}
				if res := call(t, next, "get", obj("queue", "X", "timeout", 3)); !bytes.Equal(res.([]byte), []byte("precious")) {
					t.Fatalf("iteration %d: got %q", i, res)
				}
				if n := call(t, next, "qsize", obj("queue", "X")); n != int64(0) {
					t.Fatalf("iteration %d: item duplicated, qsize %v", i, n)
				}
			},
		},
		{
			name: "put",
			setup: func(t *testing.T, c *proxy.Client) {
				call(t, c, "create", obj("queue", "X", "maxsize", 1))
				call(t, c, "put", obj("queue", "X", "item", []byte("first")))
			},
			park: func(r *rawConn) { r.send(1, "put", obj("queue", "X", "item", []byte("second"))) },
			obj:  [2]string{"queue", "X"},
			grant: func(t *testing.T, c *proxy.Client) {
				if res, err := c.Call(context.Background(), "get", obj("queue", "X", "timeout", 3), nil); err != nil || !bytes.Equal(res.([]byte), []byte("first")) {
					t.Errorf("get: %q %v", res, err)
				}
			},
			check: func(t *testing.T, next *proxy.Client, _ bool, i int) {
				// The leaving putter's item went in only if it won the race;
				// either way there is room for the next client's put.
				res, err := next.Call(context.Background(), "get", obj("queue", "X", "block", false), nil)
				if err == nil && !bytes.Equal(res.([]byte), []byte("second")) || err != nil && code(err) != wire.CodeEmpty {
					t.Fatalf("iteration %d: %q %v", i, res, err)
				}
				call(t, next, "put", obj("queue", "X", "item", []byte("third"), "timeout", 3))
				if res := call(t, next, "get", obj("queue", "X", "block", false)); !bytes.Equal(res.([]byte), []byte("third")) {
					t.Fatalf("iteration %d: got %q", i, res)
				}
			},
		},
	}
}

// TestDisconnectWhileParked: a client that disconnects while parked never
// takes the lock, unit or item, also when the grant races with its
// disconnect; the next client gets it.
//
// In the racy rounds the leaving client only shuts its writing side, which
// the server sees as a disconnect, and then reads what still arrives: a
// reply written before the server noticed was delivered (as to a client
// that died right after reading it); anything else must be given back.
func TestDisconnectWhileParked(t *testing.T) {
	for _, tc := range disconnectCases() {
		t.Run(tc.name, func(t *testing.T) {
			const rounds = 20
			nDelivered := 0
			defer func() { t.Logf("%d of %d racy rounds delivered before the disconnect", nDelivered, rounds-1) }()
			for i := 0; i < rounds; i++ {
				ts := startServer(t)
				other, next := ts.dial(t), ts.dial(t)
				tc.setup(t, other)
				r := ts.raw(t, nil)
				tc.park(r)
				ts.waitWaiters(t, manager.Kind(tc.obj[0]), tc.obj[1], 1)
				delivered := false
				if i == 0 { // first without the race: gone before the grant
					r.nc.Close()
					ts.waitWaiters(t, manager.Kind(tc.obj[0]), tc.obj[1], 0)
					tc.grant(t, other)
				} else {
					together(func() { r.nc.(*net.UnixConn).CloseWrite() }, func() { tc.grant(t, other) })
					if delivered = r.readUntilClosed()[1]; delivered {
						nDelivered++
					}
				}
				ts.waitSessions(t, 2)
				tc.check(t, next, delivered, i)
				ts.stop(t)
			}
		})
	}
}

// TestWriteFailureGivesBack: a grant whose reply cannot be written (the
// client shut its side for reading) is given back.
func TestWriteFailureGivesBack(t *testing.T) {
	ts := startServer(t)
	other := ts.dial(t)
	call(t, other, "create", obj("queue", "Q"))
	r := ts.raw(t, nil)
	r.send(1, "get", obj("queue", "Q"))
	ts.waitWaiters(t, "queue", "Q", 1)
	if err := r.nc.(*net.UnixConn).CloseRead(); err != nil {
		t.Fatal(err)
	}
	call(t, other, "put", obj("queue", "Q", "item", []byte("precious")))
	res := call(t, other, "get", obj("queue", "Q", "timeout", 3))
	if !bytes.Equal(res.([]byte), []byte("precious")) {
		t.Fatalf("got %q", res)
	}
}

func TestDisconnectWhileHolding(t *testing.T) {
	ts := startServer(t)
	a, b := ts.dial(t), ts.dial(t)
	ctx := ctxT(t)
	for _, kind := range []string{"lock", "rlock", "semaphore", "bounded_semaphore"} {
		call(t, a, "create", obj(kind, kind, "value", 1))
		call(t, a, "acquire", obj(kind, kind, "tid", 1))
		call(t, a, "acquire", obj(kind, kind, "tid", 1, "block", false)) // nests for rlock
	}
	type res struct {
		kind string
		v    any
		err  error
	}
	got := make(chan res, 4)
	for _, kind := range []string{"lock", "rlock", "semaphore", "bounded_semaphore"} {
		go func() {
			v, err := b.Call(ctx, "acquire", obj(kind, kind, "tid", 2), nil)
			got <- res{kind, v, err}
		}()
		ts.waitWaiters(t, manager.Kind(kind), kind, 1)
	}
	a.Close()
	for i := 0; i < 4; i++ {
		select {
		case r := <-got:
			if r.v != true || r.err != nil {
				t.Fatalf("%s: %v %v", r.kind, r.v, r.err)
			}
		case <-time.After(bound):
			t.Fatal("waiters not served after the holder disconnected")
		}
	}
}

func TestSessionAcrossConnections(t *testing.T) {
	ts := startServer(t)
	sid := []byte("0123456789abcdef")
	c1, c2 := ts.dial(t, proxy.WithSession(sid)), ts.dial(t, proxy.WithSession(sid))
	other := ts.dial(t)
	if !bytes.Equal(c1.Info().Session, sid) {
		t.Fatalf("session %x", c1.Info().Session)
	}
	call(t, c1, "create", obj("lock", "L"))
	call(t, c1, "acquire", obj("lock", "L", "tid", 1))
	call(t, c2, "create", obj("rlock", "R"))
	call(t, c2, "acquire", obj("rlock", "R", "tid", 7))
	if err := callErr(c1, "release", obj("rlock", "R", "tid", 7)); err != nil {
		t.Fatalf("same session, same tid, other connection: %v", err)
	}
	call(t, c2, "acquire", obj("rlock", "R", "tid", 7))
	c1.Close()
	ts.waitSessions(t, 2)
	if call(t, other, "acquire", obj("lock", "L", "block", false)) != false {
		t.Fatal("released while the session has another connection")
	}
	c2.Close()
	ts.waitSessions(t, 1)
	for _, o := range []map[string]any{obj("lock", "L", "timeout", 3), obj("rlock", "R", "timeout", 3)} {
		if call(t, other, "acquire", o) != true {
			t.Fatalf("%v not released when the session ended", o)
		}
	}
}

func TestRepliesOutOfOrder(t *testing.T) {
	ts := startServer(t)
	other := ts.dial(t)
	call(t, other, "create", obj("lock", "L"))
	call(t, other, "acquire", obj("lock", "L"))
	call(t, other, "create", obj("queue", "Q"))
	call(t, other, "create", obj("event", "E"))
	r := ts.raw(t, nil)
	r.send(1, "acquire", obj("lock", "L", "tid", 1))
	r.send(2, "get", obj("queue", "Q"))
	r.send(3, "wait", obj("event", "E"))
	r.send(4, "ping", nil)
	r.send(5, "qsize", obj("queue", "Q"))
	if rep := r.recv(); rep.ID != 4 || rep.Err != nil {
		t.Fatalf("first reply %+v, want the ping", rep)
	}
	if rep := r.recv(); rep.ID != 5 || rep.Result != int64(0) {
		t.Fatalf("second reply %+v, want qsize", rep)
	}
	// A second request with an id still in flight is refused, and the
	// first stays parked.
	r.send(2, "get", obj("queue", "Q"))
	if rep := r.recv(); rep.ID != 2 || rep.Err == nil || rep.Err.Code != wire.CodeBadRequest {
		t.Fatalf("duplicate id: %+v", rep)
	}
	r.noReply(20 * time.Millisecond)
	call(t, other, "set", obj("event", "E"))
	if rep := r.recv(); rep.ID != 3 || rep.Result != true {
		t.Fatalf("reply %+v, want the event wait", rep)
	}
	call(t, other, "put", obj("queue", "Q", "item", []byte("x")))
	if rep := r.recv(); rep.ID != 2 || !bytes.Equal(rep.Result.([]byte), []byte("x")) {
		t.Fatalf("reply %+v, want the get", rep)
	}
	call(t, other, "release", obj("lock", "L"))
	if rep := r.recv(); rep.ID != 1 || rep.Result != true {
		t.Fatalf("reply %+v, want the acquire", rep)
	}
}

func TestPipelining(t *testing.T) {
	ts := startServer(t)
	r := ts.raw(t, nil)
	var buf bytes.Buffer
	const n = 200
	for i := 1; i <= n; i++ {
		var frame []byte
		var err error
		if i == 1 {
			frame, err = wire.EncodeRequest(uint64(i), "create", obj("value", "V", "typecode", "q"))
		} else {
			frame, err = wire.EncodeRequest(uint64(i), "add", obj("value", "V", "delta", 1))
		}
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(frame)
	}
	if _, err := r.nc.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		rep := r.recv()
		if rep.ID != uint64(i) || rep.Err != nil {
			t.Fatalf("reply %d: %+v", i, rep)
		}
		if i > 1 && rep.Result != int64(i-1) {
			t.Fatalf("reply %d: %v, executed out of order", i, rep.Result)
		}
	}
}

func TestMalformedFrames(t *testing.T) {
	ts := startServer(t, func(o *serverOpts) { o.cfg.MaxFrame = 1024 })
	good := ts.dial(t)
	call(t, good, "create", obj("value", "keep", "typecode", "i", "value", 42))
	hdr := func(n uint32) []byte { return []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)} }
	tests := []struct {
		name string
		send func(r *rawConn)
		code wire.Code
	}{
		{"garbage body", func(r *rawConn) { r.sendBody([]byte("GET / HTTP/1.0\r\n\r\n")) }, wire.CodeBadRequest},
		{"not an array", func(r *rawConn) { r.sendBody([]byte{0xa4, 'p', 'i', 'n', 'g'}) }, wire.CodeBadRequest},
		{"nested arg", func(r *rawConn) {
			f, _ := wire.EncodeRequest(1, "set", map[string]any{"value": []any{1}})
			r.nc.Write(f)
		}, wire.CodeBadRequest},
		{"bin32 claiming 2 GiB", func(r *rawConn) {
			r.sendBody([]byte{0x93, 0x01, 0xa1, 'x', 0x81, 0xa1, 'k', 0xc6, 0x7f, 0xff, 0xff, 0xff})
		}, wire.CodeBadRequest},
		{"trailing bytes", func(r *rawConn) {
			f, _ := wire.EncodeRequest(1, "ping", nil)
			r.sendBody(append(f[wire.HeaderSize:], 0xc0))
		}, wire.CodeBadRequest},
		{"empty frame", func(r *rawConn) { r.nc.Write(hdr(0)) }, wire.CodeBadRequest},
		// Over the limit with no readable request id: nothing to answer
		// under, so the connection ends (see TestOversizedFrameSkipped).
		{"over the limit", func(r *rawConn) { r.nc.Write(append(hdr(1025), make([]byte, 1025)...)) }, wire.CodeTooLarge},
		{"4 GiB claimed", func(r *rawConn) { r.nc.Write(append(hdr(0xffffffff), make([]byte, wire.MaxIDPrefix)...)) }, wire.CodeTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.raw(t, nil)
			r.send(1, "ping", nil)
			if rep := r.recv(); rep.ID != 1 {
				t.Fatalf("ping: %+v", rep)
			}
			tt.send(r)
			rep := r.recv()
			if rep.ID != 0 || rep.Err == nil || rep.Err.Code != tt.code {
				t.Fatalf("got %+v, want an id-0 %s error", rep, tt.code)
			}
			r.closed()
			if got := call(t, good, "get", obj("value", "keep")); got != int64(42) {
				t.Fatalf("the good client's value is %v", got)
			}
		})
	}
	ts.waitSessions(t, 1)
}

func TestHandshakeLimits(t *testing.T) {
	ts := startServer(t, func(o *serverOpts) {
		o.cfg.HandshakeTimeout = 300 * time.Millisecond
		o.cfg.MaxUnauthenticated = 2
		o.cfg.MaxConns = 3
	})
	good := ts.dial(t)
	// The daemon counts a connection (frees its handshake slot, counts it
	// as authenticated) just after the client's side of the handshake ends:
	// wait for the counts, or a client could be let in or turned away early.
	waitStat := func(key string, want int64) {
		t.Helper()
		for deadline := time.Now().Add(bound); ; time.Sleep(time.Millisecond) {
			st := call(t, good, "status", nil).(map[string]any)["server"].(map[string]any)
			if st[key] == want || st[key] == uint64(want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s stays at %v, want %d", key, st[key], want)
			}
		}
	}
	waitStat("handshaking", 0)
	silent := func() net.Conn {
		nc, err := net.Dial("unix", ts.path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	// Two silent clients fill the handshake slots; a third still gets its
	// hello, and the oldest pending handshake is dropped to make room.
	s1, s2 := silent(), silent()
	for _, s := range []net.Conn{s1, s2} {
		s.SetReadDeadline(time.Now().Add(bound))
		if _, err := wire.ReadFrame(s, wire.HandshakeMaxFrame); err != nil {
			t.Fatalf("hello: %v", err)
		}
	}
	s3 := silent()
	s3.SetReadDeadline(time.Now().Add(bound))
	if _, err := wire.ReadFrame(s3, wire.HandshakeMaxFrame); err != nil {
		t.Fatalf("a newcomer over --max-handshakes got no hello: %v", err)
	}
	s1.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := wire.ReadFrame(s1, wire.HandshakeMaxFrame); err == nil || isTimeout(err) {
		t.Fatalf("the oldest pending handshake was not dropped: %v", err)
	}
	call(t, good, "ping", nil) // the authenticated client is unaffected
	// The handshake deadline frees the slots.
	start := time.Now()
	for _, s := range []net.Conn{s2, s3} {
		if _, err := wire.ReadFrame(s, wire.HandshakeMaxFrame); err == nil {
			t.Fatal("a silent client got more than hello")
		}
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("silent clients held on for %v", el)
	}
	deadline := time.Now().Add(bound)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := proxy.Dial(ctx, ts.path, testKey)
		cancel()
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new connection after the silent ones timed out: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A wrong key is refused without disturbing anyone.
	ctx := ctxT(t)
	if _, err := proxy.Dial(ctx, ts.path, []byte("wrong")); !errors.Is(err, proxy.ErrAuthFailed) {
		t.Fatalf("wrong key: %v", err)
	}
	// Authenticated connections are capped too.
	ts.waitSessions(t, 1)
	ts.dial(t)
	ts.dial(t)
	waitStat("connections", 3)
	_, err := proxy.Dial(ctx, ts.path, testKey)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeLimit {
		t.Fatalf("over --max-conns: %v", err)
	}
	call(t, good, "ping", nil)
}

func TestShutdownAnswersParked(t *testing.T) {
	ts := startServer(t, func(o *serverOpts) { o.cfg.HandshakeTimeout = time.Minute })
	holder := ts.dial(t)
	call(t, holder, "create", obj("lock", "L"))
	call(t, holder, "acquire", obj("lock", "L"))
	call(t, holder, "create", obj("queue", "Q", "maxsize", 1))
	call(t, holder, "create", obj("queue", "F", "maxsize", 1))
	call(t, holder, "put", obj("queue", "F", "item", []byte("x")))
	call(t, holder, "create", obj("event", "E"))
	r := ts.raw(t, nil)
	r.send(1, "acquire", obj("lock", "L"))
	r.send(2, "get", obj("queue", "Q"))
	r.send(3, "put", obj("queue", "F", "item", []byte("y")))
	r.send(4, "wait", obj("event", "E"))
	c := ts.dial(t)
	ctx := ctxT(t)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, "acquire", obj("lock", "L", "tid", 2), nil)
		errc <- err
	}()
	ts.waitWaiters(t, "lock", "L", 2)
	ts.waitWaiters(t, "queue", "Q", 1)
	ts.waitWaiters(t, "queue", "F", 1)
	ts.waitWaiters(t, "event", "E", 1)
	// A client stuck in the handshake must not hold the shutdown up.
	hs, err := net.Dial("unix", ts.path)
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()

	start := time.Now()
	ts.stop(t)
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("shutdown took %v", el)
	}
	got := map[uint64]bool{}
	for i := 0; i < 4; i++ {
		rep := r.recv()
		if rep.Err == nil || rep.Err.Code != wire.CodeShutdown {
			t.Fatalf("parked request answered %+v", rep)
		}
		got[rep.ID] = true
	}
	if len(got) != 4 {
		t.Fatalf("answers %v", got)
	}
	r.closed()
	select {
	case err := <-errc:
		if code(err) != wire.CodeShutdown {
			t.Fatalf("Go client: %v", err)
		}
	case <-time.After(bound):
		t.Fatal("Go client not answered")
	}
	if _, err := net.Dial("unix", ts.path); err == nil {
		t.Fatal("still accepting after shutdown")
	}
}

// TestShutdownUnderLoad shuts servers down while clients keep parking
// requests and connecting, for the race detector to look at.
func TestShutdownUnderLoad(t *testing.T) {
	for round := 0; round < 4; round++ {
		ts := startServer(t)
		setup := ts.dial(t)
		call(t, setup, "create", obj("lock", "L"))
		call(t, setup, "create", obj("queue", "Q"))
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), bound)
				defer cancel()
				c, err := proxy.Dial(ctx, ts.path, testKey)
				if err != nil {
					return // the server may be gone already
				}
				defer c.Close()
				for j := 0; ; j++ {
					select {
					case <-stop:
						return
					default:
					}
					var err error
					switch j % 3 {
					case 0:
						var res any
						res, err = c.Call(ctx, "acquire", obj("lock", "L", "timeout", 0.01), nil)
						if res == true {
							_, err = c.Call(ctx, "release", obj("lock", "L"), nil)
						}
					case 1:
						_, err = c.Call(ctx, "get", obj("queue", "Q", "timeout", 0.01), nil)
						if code(err) == wire.CodeEmpty {
							err = nil
						}
					case 2:
						_, err = c.Call(ctx, "put", obj("queue", "Q", "item", []byte(fmt.Sprint(j))), nil)
					}
					if err != nil {
						return // shutting down
					}
				}
			}()
		}
		wg.Add(1)
		go func() { // keeps connecting
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				c, err := proxy.Dial(ctx, ts.path, testKey)
				cancel()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		time.Sleep(50 * time.Millisecond)
		ts.stop(t)
		close(stop)
		wg.Wait()
	}
}

func TestServeAfterShutdown(t *testing.T) {
	ts := startServer(t)
	ts.stop(t)
	ln, err := server.ListenUnix(ts.path + "2")
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.srv.Serve(ln); err != nil {
		t.Fatalf("Serve after Shutdown: %v", err)
	}
	if err := ts.srv.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
