package server_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/internal/leakcheck"
	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }

// bound is the longest any single wait in these tests may take.
const bound = 5 * time.Second

var testKey = []byte("server-test-key")

// testServer is a Server on a Unix socket in a short temp dir.
type testServer struct {
	srv      *server.Server
	path     string
	tls      *tls.Config // a TLS listener on 127.0.0.1 (path is then its address): the clients' config
	serveErr chan error
	stopOnce sync.Once
}

type serverOpts struct {
	cfg  server.Config
	mcfg manager.Config
	tls  bool // listen on TCP+TLS on 127.0.0.1, not on a Unix socket
}

// overTLS has startServer listen on TCP+TLS on 127.0.0.1.
func overTLS(o *serverOpts) { o.tls = true }

func startServer(t *testing.T, opts ...func(*serverOpts)) *testServer {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "sm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Event loops from the first connection: the tests run on them unless
	// they ask for a goroutine per connection (EventLoops < 0).
	o := serverOpts{cfg: server.Config{Key: testKey, Logger: zerolog.Nop(), EventLoopMinConns: 1}, mcfg: manager.DefaultConfig()}
	for _, f := range opts {
		f(&o)
	}
	srv, err := server.New(o.cfg, manager.New(o.mcfg))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "s.sock")
	ts := &testServer{srv: srv, path: path, serveErr: make(chan error, 1)}
	var ln net.Listener
	if o.tls {
		cert, pool := selfSigned(t)
		ln, err = server.ListenTCP("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		ts.path, ts.tls = ln.Addr().String(), &tls.Config{RootCAs: pool}
	} else {
		ln, err = server.ListenUnix(path)
	}
	if err != nil {
		t.Fatal(err)
	}
	go func() { ts.serveErr <- srv.Serve(ln) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts
}

// stop shuts the server down and checks that Serve returned nil.
func (ts *testServer) stop(t *testing.T) {
	t.Helper()
	ts.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		if err := ts.srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		select {
		case err := <-ts.serveErr:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(bound):
			t.Error("Serve did not return after Shutdown")
		}
	})
}

func (ts *testServer) dial(t *testing.T, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	addr := ts.path
	if ts.tls != nil {
		addr = "tcp://" + addr
		opts = append(opts, proxy.WithTLS(ts.tls))
	}
	c, err := proxy.Dial(ctx, addr, testKey, opts...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitWaiters waits until the named object has n waiters.
func (ts *testServer) waitWaiters(t *testing.T, kind manager.Kind, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		obj, err := ts.srv.Manager().Lookup(kind, name)
		if err != nil {
			t.Fatalf("lookup %s: %v", name, err)
		}
		if _, w := obj.Describe(); w == n {
			return
		}
		if time.Now().After(deadline) {
			_, w := obj.Describe()
			t.Fatalf("%s: %d waiters, want %d", name, w, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitSessions waits until the manager has n sessions.
func (ts *testServer) waitSessions(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		if _, s := ts.srv.Manager().Count(); s == n {
			return
		}
		if time.Now().After(deadline) {
			_, s := ts.srv.Manager().Count()
			t.Fatalf("%d sessions, want %d", s, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// obj builds the args of an object op.
func obj(kind, name string, kv ...any) map[string]any {
	m := map[string]any{"kind": kind, "name": name}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// startFastServer is startServer with the fast path on: a state segment
// of its own, closed after the server has stopped (t.Cleanup runs last
// what it was given first), so no session touches unmapped words.
func startFastServer(t *testing.T, opts ...func(*serverOpts)) (*testServer, *statemem.Segment) {
	t.Helper()
	seg, err := statemem.Create(64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	ts := startServer(t, opts...)
	ts.srv.Manager().EnableFastPath(seg)
	return ts, seg
}

// rawConn speaks the protocol by hand, after a real handshake.
type rawConn struct {
	t  *testing.T
	nc net.Conn
}

func (ts *testServer) raw(t *testing.T, session []byte) *rawConn {
	t.Helper()
	var nc net.Conn
	var err error
	if ts.tls != nil {
		nc, err = tls.DialWithDialer(&net.Dialer{Timeout: bound}, "tcp", ts.path, ts.tls)
	} else {
		nc, err = net.DialTimeout("unix", ts.path, bound)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(bound))
	if _, err := auth.Client(nc, auth.ClientConfig{Key: testKey, Session: session, Label: "raw"}); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	_ = nc.SetDeadline(time.Time{})
	return &rawConn{t: t, nc: nc}
}

func (r *rawConn) send(id uint64, op string, args map[string]any) {
	r.t.Helper()
	frame, err := wire.EncodeRequest(id, op, args)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.nc.Write(frame); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

func (r *rawConn) sendBody(body []byte) {
	r.t.Helper()
	if err := wire.WriteFrame(r.nc, body); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

func (r *rawConn) recv() wire.Reply {
	r.t.Helper()
	_ = r.nc.SetReadDeadline(time.Now().Add(bound))
	body, err := wire.ReadFrame(r.nc, wire.DefaultMaxFrame)
	if err != nil {
		r.t.Fatalf("read reply: %v", err)
	}
	rep, err := wire.DecodeReply(body)
	if err != nil {
		r.t.Fatalf("decode reply: %v", err)
	}
	return rep
}

// noReply checks that no reply arrives within d.
func (r *rawConn) noReply(d time.Duration) {
	r.t.Helper()
	_ = r.nc.SetReadDeadline(time.Now().Add(d))
	body, err := wire.ReadFrame(r.nc, wire.DefaultMaxFrame)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		rep, _ := wire.DecodeReply(body)
		r.t.Fatalf("unexpected reply %+v (err %v)", rep, err)
	}
}

// readUntilClosed reads replies until the server closes the connection and
// reports, by id, which requests were answered with success.
func (r *rawConn) readUntilClosed() map[uint64]bool {
	r.t.Helper()
	ok := map[uint64]bool{}
	_ = r.nc.SetReadDeadline(time.Now().Add(bound))
	for {
		body, err := wire.ReadFrame(r.nc, wire.DefaultMaxFrame)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				r.t.Fatal("the server did not close the connection")
			}
			return ok
		}
		rep, err := wire.DecodeReply(body)
		if err != nil {
			r.t.Fatalf("decode reply: %v", err)
		}
		if rep.Err == nil {
			ok[rep.ID] = true
		}
	}
}

// closed checks that the server closes the connection (after any frames
// already sent).
func (r *rawConn) closed() {
	r.t.Helper()
	_ = r.nc.SetReadDeadline(time.Now().Add(bound))
	buf := make([]byte, 1024)
	for {
		_, err := r.nc.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			r.t.Fatal("the server did not close the connection")
		}
		return
	}
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

// together runs the functions at (nearly) the same moment and waits.
func together(fns ...func()) {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for _, fn := range fns {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			fn()
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
}
