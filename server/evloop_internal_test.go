package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// A connection served by its own goroutine while the daemon has few moves
// into a loop between two requests once the daemon has EventLoopMinConns:
// a request it had parked before is answered after, its pipelined requests
// keep their order across the move, and it is served by the loop from then
// on.
func TestConnectionMovesIntoALoop(t *testing.T) {
	srv, dial := startLoopServer(t, 3)
	send := func(_ net.Conn, id uint64, op string, args map[string]any) []byte { return request(t, id, op, args) }
	recv := func(nc net.Conn) wire.Reply { return readReply(t, nc) }
	// inLoops waits until the server tracks want connections, and until
	// (for a while) settled says the number of them in a loop is final;
	// it returns that number. A connection moves after its reply is
	// written, so a client can see the reply first.
	inLoops := func(want int, settled func(int) bool) (n int) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			srv.mu.Lock()
			n = 0
			for c := range srv.conns {
				if c.lp.Load() != nil {
					n++
				}
			}
			have := len(srv.conns)
			srv.mu.Unlock()
			if have == want && settled(n) || time.Now().After(deadline) {
				return n
			}
			time.Sleep(time.Millisecond)
		}
	}
	anyN := func(int) bool { return true }
	is := func(k int) func(int) bool { return func(n int) bool { return n == k } }

	first := dial()
	defer first.Close()
	obj := map[string]any{"kind": "queue", "name": "q"}
	if _, err := first.Write(send(first, 1, "create", obj)); err != nil {
		t.Fatal(err)
	}
	if rep := recv(first); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	if _, err := first.Write(send(first, 2, "get", map[string]any{"kind": "queue", "name": "q", "timeout": 5.0})); err != nil {
		t.Fatal(err) // parked: answered after the move
	}
	if n := inLoops(1, anyN); n != 0 {
		t.Fatalf("%d connections in a loop with one connection open", n)
	}
	others := []net.Conn{dial(), dial()}
	for _, o := range others {
		defer o.Close()
	}
	// The third went straight to a loop; the first moves after its next
	// request (which may already be the parked get, read before).
	if n := inLoops(3, anyN); n < 1 || n > 2 {
		t.Fatalf("%d connections in a loop once three are open, want the third (and maybe the first)", n)
	}
	var batch bytes.Buffer
	for i := range 40 { // the move happens after the first of these
		batch.Write(send(first, uint64(10+i), "create", map[string]any{"kind": "dict", "name": fmt.Sprint("d", i)}))
	}
	if _, err := first.Write(batch.Bytes()); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if rep := recv(first); rep.Err != nil || rep.ID != uint64(10+i) {
			t.Fatalf("reply %d: %+v, want id %d", i, rep, 10+i)
		}
	}
	if n := inLoops(3, is(2)); n != 2 {
		t.Fatalf("%d connections in a loop after the first one's requests, want 2 (the second has sent nothing)", n)
	}
	if _, err := others[0].Write(send(others[0], 1, "put", map[string]any{"kind": "queue", "name": "q", "item": []byte("x")})); err != nil {
		t.Fatal(err)
	}
	if rep := recv(others[0]); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	if rep := recv(first); rep.ID != 2 || rep.Err != nil {
		t.Fatalf("the get parked before the move: %+v", rep)
	}
	// The server may have taken the two others' handshakes in either
	// order (each ends on the server after the client has its welcome), so
	// either may be the one with a goroutine of its own: both send.
	if _, err := others[1].Write(send(others[1], 1, "ping", nil)); err != nil {
		t.Fatal(err)
	}
	if rep := recv(others[1]); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	if n := inLoops(3, is(3)); n != 3 {
		t.Fatalf("%d connections in a loop after the second one's request, want 3", n)
	}
}

// startLoopServer starts a server on a Unix socket whose connections go to
// its event loops from minConns on, and returns it with a dialer of
// authenticated connections. It has one loop; it stops when the test ends.
func startLoopServer(t *testing.T, minConns int) (*Server, func() net.Conn) {
	t.Helper()
	return startLoopServerOn(t, minConns, manager.New(manager.DefaultConfig()))
}

// startLoopServerOn is startLoopServer serving mgr.
func startLoopServerOn(t *testing.T, minConns int, mgr *manager.Manager) (*Server, func() net.Conn) {
	t.Helper()
	key := []byte("k")
	srv, err := New(Config{Key: key, Logger: zerolog.Nop(), EventLoops: 1, EventLoopMinConns: minConns}, mgr)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/tmp", "sml")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "s")
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	serveUntilCleanup(t, srv, ln)
	return srv, func() net.Conn {
		nc, err := net.DialTimeout("unix", path, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := auth.Client(nc, auth.ClientConfig{Key: key, Label: "t"}); err != nil {
			t.Fatal(err)
		}
		return nc
	}
}

// serveUntilCleanup serves ln until the test ends, then shuts srv down.
func serveUntilCleanup(t *testing.T, srv *Server, ln net.Listener) {
	t.Helper()
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
}

// request is a request's frame.
func request(t *testing.T, id uint64, op string, args map[string]any) []byte {
	t.Helper()
	f, err := wire.EncodeRequest(id, op, args)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// readReply reads and decodes one reply.
func readReply(t *testing.T, nc net.Conn) wire.Reply {
	t.Helper()
	body, err := wire.ReadFrame(nc, wire.DefaultMaxFrame)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := wire.DecodeReply(body)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// A loop's goroutine keeps its thread, under SCHED_BATCH, while the daemon
// has EventLoopMinConns plain connections, and lets it go, under
// SCHED_OTHER again, once it has fewer.
func TestBusyLoopYieldsToClients(t *testing.T) {
	srv, dial := startLoopServer(t, 3)
	ping := func(nc net.Conn, id uint64) {
		t.Helper()
		if _, err := nc.Write(request(t, id, "ping", nil)); err != nil {
			t.Fatal(err)
		}
		if rep := readReply(t, nc); rep.Err != nil || rep.ID != id {
			t.Fatalf("ping %d: %+v", id, rep)
		}
	}
	policy := func(tid int) uint32 {
		t.Helper()
		attr, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			t.Fatalf("sched_getattr(%d): %v", tid, err)
		}
		return attr.Policy
	}
	// kept returns the loop's kept thread once want says it is final.
	kept := func(nc net.Conn, want func(int) bool) int {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for id := uint64(100); ; id++ {
			ping(nc, id) // the loop looks at the count after each wait
			tid := int(srv.eventLoops()[0].tid.Load())
			if want(tid) || time.Now().After(deadline) {
				return tid
			}
			time.Sleep(time.Millisecond)
		}
	}
	conns := []net.Conn{dial(), dial(), dial()}
	for i, nc := range conns {
		defer nc.Close()
		ping(nc, uint64(i+1))
	}
	if len(srv.eventLoops()) != 1 {
		t.Fatalf("%d event loops, want 1 (the test looks at the first)", len(srv.eventLoops()))
	}
	tid := kept(conns[2], func(tid int) bool { return tid != 0 })
	if tid == 0 {
		t.Fatal("the loop kept no thread with three connections open")
	}
	if p := policy(tid); p != unix.SCHED_BATCH {
		t.Fatalf("the loop's thread %d has policy %d with three connections open, want SCHED_BATCH (%d)", tid, p, unix.SCHED_BATCH)
	}
	for _, nc := range conns[:2] {
		nc.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for srv.plain.Load() > 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if now := kept(conns[2], func(tid int) bool { return tid == 0 }); now != 0 {
		t.Fatalf("the loop still keeps thread %d with one connection open", now)
	}
	if p := policy(tid); p != unix.SCHED_NORMAL {
		t.Fatalf("thread %d, given back, has policy %d, want SCHED_OTHER (%d)", tid, p, unix.SCHED_NORMAL)
	}
}

// tcpLoopConn starts a server with one event loop on TCP loopback (TLS
// with a self-signed certificate if overTLS), and returns an authenticated
// connection to it (deadline 20 s) with the server's side of it, once that
// is in the loop; both end with the test.
func tcpLoopConn(t *testing.T, overTLS bool) (net.Conn, *conn) {
	t.Helper()
	key := []byte("k")
	srv, err := New(Config{Key: key, Logger: zerolog.Nop(), EventLoops: 1}, manager.New(manager.DefaultConfig()))
	if err != nil {
		t.Fatal(err)
	}
	var cfg *tls.Config
	if overTLS {
		if cfg, _, err = SelfSignedTLS("127.0.0.1", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := ListenTCP("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	serveUntilCleanup(t, srv, ln)
	var nc net.Conn
	if overTLS {
		nc, err = tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true})
	} else {
		nc, err = net.Dial("tcp", ln.Addr().String())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := auth.Client(nc, auth.ClientConfig{Key: key, Label: "t"}); err != nil {
		t.Fatal(err)
	}
	var in *conn
	for deadline := time.Now().Add(5 * time.Second); in == nil; time.Sleep(time.Millisecond) {
		srv.mu.Lock()
		for c := range srv.conns {
			if c.lp.Load() != nil {
				in = c
			}
		}
		srv.mu.Unlock()
		if in == nil && time.Now().After(deadline) {
			t.Fatal("the TCP connection is not in an event loop")
		}
	}
	return nc, in
}

// A client that pipelines gets of a large value and does not read, over
// TCP and TLS: its loop runs its requests only while less than outLimit
// bytes of replies wait for it (over TLS each reply of up to sealPiece
// bytes is sealed at once, a copy of its bytes), keeps the rest of what it
// read, and runs those as the client reads; every reply comes, in order.
func TestPipelinedRequestsWaitForTheirReader(t *testing.T) {
	for _, overTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "tcp", true: "tls"}[overTLS], func(t *testing.T) {
			nc, c := tcpLoopConn(t, overTLS)
			lp := c.lp.Load()
			const size, gets = 1 << 20, 48
			for i, r := range [][]byte{
				request(t, 1, "create", map[string]any{"kind": "dict", "name": "d"}),
				request(t, 2, "set", map[string]any{"kind": "dict", "name": "d", "key": []byte("k"), "kp": []byte("k"),
					"value": bytes.Repeat([]byte{'v'}, size)}),
			} {
				if _, err := nc.Write(r); err != nil {
					t.Fatal(err)
				}
				if rep := readReply(t, nc); rep.Err != nil {
					t.Fatalf("request %d: %v", i+1, rep.Err)
				}
			}
			var batch []byte
			for i := range gets {
				batch = append(batch, request(t, uint64(10+i), "get", map[string]any{"kind": "dict", "name": "d", "key": []byte("k")})...)
			}
			if _, err := nc.Write(batch); err != nil { // one write: one read of the loop's, one record
				t.Fatal(err)
			}
			// The most that may wait: outLimit, one more reply that went
			// over it, and its records' overhead.
			bound, most := outLimit+size+sealOverhead(size)+4096, 0
			for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				c.wmu.Lock()
				most = max(most, lp.outBytes)
				c.wmu.Unlock()
			}
			if most > bound {
				t.Fatalf("%d bytes of replies waited for a client that did not read (at most %d)", most, bound)
			}
			if most < outLimit {
				t.Fatalf("only %d bytes of replies waited: the client's socket took them all, and nothing was tested", most)
			}
			for i := range gets {
				rep := readReply(t, nc)
				if rep.Err != nil || rep.ID != uint64(10+i) {
					t.Fatalf("reply %d: id %d, error %v", i, rep.ID, rep.Err)
				}
			}
		})
	}
}

// A large frame's body arriving over TCP, plain or TLS, to a connection in
// an event loop: while at least lowatMin of it (less what crypto/tls may
// hold) is still to come, the socket reports readable only once lowatMax
// bytes have arrived, not at each record; the request is executed when the
// body is complete, and the socket is back at 1 for the next small request.
func TestLoopWaitsForALargeBodyInPieces(t *testing.T) {
	for _, overTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "tcp", true: "tls"}[overTLS], func(t *testing.T) {
			nc, c := tcpLoopConn(t, overTLS)
			lp := c.lp.Load()
			if _, err := nc.Write(request(t, 1, "create", map[string]any{"kind": "queue", "name": "q"})); err != nil {
				t.Fatal(err)
			}
			if rep := readReply(t, nc); rep.Err != nil {
				t.Fatal(rep.Err)
			}
			lowat := func() int {
				v, err := unix.GetsockoptInt(lp.fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			waitLowat := func(want int) {
				t.Helper()
				for deadline := time.Now().Add(5 * time.Second); lowat() != want; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("SO_RCVLOWAT is %d, want %d", lowat(), want)
					}
				}
			}
			frame := request(t, 2, "put", map[string]any{"kind": "queue", "name": "q", "item": make([]byte, 1<<20)})
			if _, err := nc.Write(frame[:100<<10]); err != nil {
				t.Fatal(err)
			}
			waitLowat(lowatMax) // 900 KiB to come (less tlsHeld under TLS)
			if _, err := nc.Write(frame[100<<10:]); err != nil {
				t.Fatal(err)
			}
			if rep := readReply(t, nc); rep.ID != 2 || rep.Err != nil {
				t.Fatalf("the large put: %+v", rep)
			}
			waitLowat(1)
			if _, err := nc.Write(request(t, 3, "ping", nil)); err != nil {
				t.Fatal(err)
			}
			if rep := readReply(t, nc); rep.ID != 3 || rep.Err != nil {
				t.Fatalf("the ping after: %+v", rep)
			}
		})
	}
}

// A connection whose turns keep ending (a peer that keeps its socket
// full) is in its loop's again list once, not once more per turn; one
// backlogged is not in it at all (flush puts it there once drained).
func TestHeldConnectionIsQueuedOnce(t *testing.T) {
	l := &evLoop{}
	c := &conn{}
	lp := &loopConn{loop: l}
	c.lp.Store(lp)
	for range 3 {
		l.hold(c)
	}
	if len(l.again) != 1 || !lp.held {
		t.Fatalf("held %v, queued %d times", lp.held, len(l.again))
	}
	l.again, lp.queued, lp.held = nil, false, false
	lp.outBytes = outLimit
	l.hold(c)
	if len(l.again) != 0 || !lp.held {
		t.Fatalf("backlogged: held %v, queued %d times", lp.held, len(l.again))
	}
}

// A large reply over TLS to a client that does not read yet is sealed a
// piece at a time as its socket drains: what waits sealed is never more
// than one piece's records (it was the whole reply, a second copy of it),
// a reply sealed after it (a parked get's, answered meanwhile) waits
// behind it as plaintext, and both come whole and in order once the
// client reads.
func TestLargeTLSReplyIsSealedAsItsSocketDrains(t *testing.T) {
	nc, c := tcpLoopConn(t, true)
	lp := c.lp.Load()
	const size = 32 << 20 // more than the sockets between take
	value := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	for i, r := range [][]byte{
		request(t, 1, "create", map[string]any{"kind": "dict", "name": "d"}),
		request(t, 2, "set", map[string]any{"kind": "dict", "name": "d", "key": []byte("k"), "kp": []byte("k"), "value": value}),
		request(t, 3, "create", map[string]any{"kind": "queue", "name": "q"}),
	} {
		if _, err := nc.Write(r); err != nil {
			t.Fatal(err)
		}
		if rep := readReply(t, nc); rep.Err != nil {
			t.Fatalf("request %d: %v", i+1, rep.Err)
		}
	}
	batch := append(request(t, 4, "get", map[string]any{"kind": "queue", "name": "q", "timeout": 20}),
		request(t, 5, "get", map[string]any{"kind": "dict", "name": "d", "key": []byte("k")})...)
	if _, err := nc.Write(batch); err != nil {
		t.Fatal(err)
	}
	q, err := c.srv.mgr.Lookup(manager.KindQueue, "q")
	if err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		c.wmu.Lock()
		defer c.wmu.Unlock()
		return len(lp.out)
	}
	for deadline := time.Now().Add(5 * time.Second); queued() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the large reply was not queued")
		}
	}
	if err := q.(*manager.Queue).Put(context.Background(), []byte("item"), false, 0); err != nil {
		t.Fatal(err)
	}
	most, plain, n := 0, 0, 0
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		c.wmu.Lock()
		sealed, p := 0, 0
		for _, ch := range lp.out {
			for _, b := range ch.bufs {
				sealed += len(b)
			}
			for _, b := range ch.plain {
				p += len(b)
			}
		}
		most, plain, n = max(most, sealed), p, len(lp.out)
		c.wmu.Unlock()
	}
	if bound := sealPiece + sealOverhead(sealPiece); most > bound {
		t.Fatalf("%d bytes of sealed records waited for a client that did not read (at most one piece's, %d)", most, bound)
	}
	if plain < size/2 || n != 2 {
		t.Fatalf("%d bytes of plaintext in %d replies waited: the client's socket took the rest, and nothing was tested", plain, n)
	}
	if rep := readReply(t, nc); rep.ID != 5 || rep.Err != nil || !bytes.Equal(rep.Result.([]byte), value) {
		t.Fatalf("the large reply: id %d, error %v", rep.ID, rep.Err)
	}
	if rep := readReply(t, nc); rep.ID != 4 || rep.Err != nil || string(rep.Result.([]byte)) != "item" {
		t.Fatalf("the parked get's reply after it: %+v", rep)
	}
}

// Replies queued behind a large TLS reply, as plaintext, are sealed
// together once it is, each in a buffer of its own size: 2000 pipelined
// pings behind a 300 KiB value cost their own bytes, not a 264 KiB buffer
// each (533 MiB when each was sealed as a piece of its own), and come in
// order.
func TestRepliesBehindALargeTLSReplyAreSealedTogether(t *testing.T) {
	nc, _ := tcpLoopConn(t, true)
	value := bytes.Repeat([]byte("x"), 300<<10)
	for i, r := range [][]byte{
		request(t, 1, "create", map[string]any{"kind": "dict", "name": "d"}),
		request(t, 2, "set", map[string]any{"kind": "dict", "name": "d", "key": []byte("k"), "kp": []byte("k"), "value": value}),
	} {
		if _, err := nc.Write(r); err != nil {
			t.Fatal(err)
		}
		if rep := readReply(t, nc); rep.Err != nil {
			t.Fatalf("request %d: %v", i+1, rep.Err)
		}
	}
	const pings = 2000
	batch := request(t, 10, "get", map[string]any{"kind": "dict", "name": "d", "key": []byte("k")})
	for i := range pings {
		batch = append(batch, request(t, uint64(100+i), "ping", nil)...)
	}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	werr := make(chan error, 1)
	go func() { _, err := nc.Write(batch); werr <- err }()
	if rep := readReply(t, nc); rep.ID != 10 || rep.Err != nil || !bytes.Equal(rep.Result.([]byte), value) {
		t.Fatalf("the large reply: id %d, error %v", rep.ID, rep.Err)
	}
	for i := range pings {
		if rep := readReply(t, nc); rep.ID != uint64(100+i) || rep.Err != nil {
			t.Fatalf("ping %d: %+v", i, rep)
		}
	}
	runtime.ReadMemStats(&m1)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if got := m1.TotalAlloc - m0.TotalAlloc; got > 64<<20 {
		t.Fatalf("%d MiB allocated to answer %d pings behind a 300 KiB reply", got>>20, pings)
	}
}
