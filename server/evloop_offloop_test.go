package server

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/statemem"
)

// ringOffLatch is the latch word's offset in a ring's header (the layout
// clients share: statemem/ring.go).
const ringOffLatch = 64

// A live client that keeps a queue ring's latch (a stopped process) holds
// up the ops on that queue, and no more: a loop serving a connection whose
// put waits on it goes on answering its other connections, and the
// waiting connection's next request, sent with the put, is answered after
// it, once the latch is let go.
func TestQueueOpBehindAHeldLatchLeavesTheLoop(t *testing.T) {
	_, dial, hold := latchServer(t)
	a, b := dial(), dial()
	letGo := hold()
	defer letGo()

	const held = time.Second
	start := time.Now()
	batch := append(request(t, 10, "put", map[string]any{"kind": "queue", "name": "q", "item": []byte("a")}),
		request(t, 11, "qsize", map[string]any{"kind": "queue", "name": "q"})...)
	if _, err := a.Write(batch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the put is waiting on the latch
	pingWithin(t, b, start, held/2, "behind the latch")
	time.Sleep(held - time.Since(start))
	letGo()
	if rep := readReply(t, a); rep.ID != 10 || rep.Err != nil {
		t.Fatalf("the put, once the latch is let go: %+v", rep)
	}
	if rep := readReply(t, a); rep.ID != 11 || rep.Err != nil || rep.Result != int64(1) {
		t.Fatalf("the qsize sent after the put: %+v", rep)
	}
	if waited := time.Since(start); waited < held {
		t.Fatalf("the put was answered after %v, before the latch was let go", waited)
	}
	// The connection goes on as before.
	if _, err := a.Write(request(t, 12, "get", map[string]any{"kind": "queue", "name": "q"})); err != nil {
		t.Fatal(err)
	}
	if rep := readReply(t, a); rep.ID != 12 || rep.Err != nil || string(rep.Result.([]byte)) != "a" {
		t.Fatalf("get: %+v", rep)
	}
}

// A connection that ends with replies of gets still unwritten: their
// undos, which wait for a latch a live client holds rather than lose
// their items, run off the loop, which goes on answering its other
// connections; once the latch is let go the items are back in the queue.
func TestUndosBehindAHeldLatchLeaveTheLoop(t *testing.T) {
	srv, dial, hold := latchServer(t)
	a, b := dial(), dial()
	const items, size = 16, 1 << 20
	for i := range items {
		if _, err := a.Write(request(t, uint64(10+i), "put", map[string]any{"kind": "queue", "name": "q",
			"item": bytes.Repeat([]byte{byte(i)}, size)})); err != nil {
			t.Fatal(err)
		}
		if rep := readReply(t, a); rep.Err != nil {
			t.Fatal(rep.Err)
		}
	}
	var gets []byte
	for i := range items {
		gets = append(gets, request(t, uint64(100+i), "get", map[string]any{"kind": "queue", "name": "q"})...)
	}
	if _, err := a.Write(gets); err != nil { // and read none of the replies
		t.Fatal(err)
	}
	waiting := func() bool { // a get's reply waits in a's output, with its grant
		srv.mu.Lock()
		defer srv.mu.Unlock()
		for c := range srv.conns {
			if lp := c.lp.Load(); lp != nil {
				c.wmu.Lock()
				n := len(lp.out)
				c.wmu.Unlock()
				if n > 0 {
					return true
				}
			}
		}
		return false
	}
	for deadline := time.Now().Add(5 * time.Second); !waiting(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no get's reply waited in its connection's output")
		}
	}
	time.Sleep(100 * time.Millisecond) // what the socket takes is taken
	letGo := hold()
	defer letGo()
	a.Close()
	time.Sleep(100 * time.Millisecond) // the loop sees a's end
	start := time.Now()
	pingWithin(t, b, start, 500*time.Millisecond, "behind the undos")
	letGo()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := b.Write(request(t, 3, "qsize", map[string]any{"kind": "queue", "name": "q"})); err != nil {
			t.Fatal(err)
		}
		rep := readReply(t, b)
		if rep.Err != nil {
			t.Fatal(rep.Err)
		}
		if n := rep.Result.(int64); n > 0 {
			break // the undone gets' items are back
		}
		if time.Now().After(deadline) {
			t.Fatal("no undone get's item came back")
		}
	}
}

// While a queue's op waits off the loop on a held latch, under the
// queue's mutex, a status and a delete of that queue, which take that
// mutex too, wait off the loop as well: another connection's ping is
// answered at once, and they are answered once the latch is let go.
func TestStatusAndDeleteBehindABusyQueueLeaveTheLoop(t *testing.T) {
	_, dial, hold := latchServer(t)
	a, b, c := dial(), dial(), dial()
	letGo := hold()
	defer letGo()
	start := time.Now()
	if _, err := a.Write(request(t, 10, "put", map[string]any{"kind": "queue", "name": "q", "item": []byte("a")})); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the put waits on the latch, holding the queue
	if _, err := c.Write(append(request(t, 20, "status", nil), request(t, 21, "delete", map[string]any{"name": "q"})...)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	pingWithin(t, b, start, 700*time.Millisecond, "behind the status or the delete")
	time.Sleep(time.Second - time.Since(start))
	letGo()
	if rep := readReply(t, a); rep.ID != 10 || rep.Err != nil {
		t.Fatalf("the put: %+v", rep)
	}
	if rep := readReply(t, c); rep.ID != 20 || rep.Err != nil {
		t.Fatalf("the status: %+v", rep)
	}
	if rep := readReply(t, c); rep.ID != 21 || rep.Err != nil || rep.Result != true {
		t.Fatalf("the delete: %+v", rep)
	}
}

// A connection's request that was kept as read while one before it ran
// off the loop, and goes off the loop again in its turn: a request sent
// after both is answered after both (it was read and run while the
// second was still off the loop).
func TestRequestsAfterAnOffLoopOneWaitForIt(t *testing.T) {
	_, dial, hold := latchServer(t)
	a := dial()
	letGo := hold() // held throughout: each put fails after LatchWait
	defer letGo()
	batch := append(request(t, 10, "put", map[string]any{"kind": "queue", "name": "q", "item": []byte("a")}),
		request(t, 11, "put", map[string]any{"kind": "queue", "name": "q", "item": []byte("b")})...)
	if _, err := a.Write(batch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // put 10 runs off the loop; put 11 waits in rest
	if _, err := a.Write(request(t, 12, "ping", nil)); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for range 3 {
		got = append(got, readReply(t, a).ID)
	}
	if got[0] != 10 || got[1] != 11 || got[2] != 12 {
		t.Fatalf("replies in the order %v, want [10 11 12]", got)
	}
}

// A Unix client that pipelines requests without replies and closes while
// the first runs off the loop: every request it sent runs (its socket's
// hang-up is seen once the first is done), as for a connection not paused.
func TestAPausedConnectionsEndKeepsItsRequests(t *testing.T) {
	_, dial, hold := latchServer(t)
	a, b := dial(), dial()
	letGo := hold()
	defer letGo()
	batch := append(request(t, 0, "put", map[string]any{"kind": "queue", "name": "q", "item": []byte("x")}),
		request(t, 0, "put", map[string]any{"kind": "queue", "name": "q", "item": []byte("y")})...)
	if _, err := a.Write(batch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // put x runs off the loop; put y waits in rest
	a.Close()
	time.Sleep(200 * time.Millisecond)
	letGo()
	var n int64
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := b.Write(request(t, 3, "qsize", map[string]any{"kind": "queue", "name": "q"})); err != nil {
			t.Fatal(err)
		}
		rep := readReply(t, b)
		if rep.Err != nil {
			t.Fatal(rep.Err)
		}
		if n = rep.Result.(int64); n == 2 {
			return
		}
	}
	t.Fatalf("qsize %d after the client's two puts, want 2", n)
}

// A connection that ends while a get of its runs off the loop, with the
// replies of two earlier gets unwritten: the off-loop get's undo, the
// latest, goes back first, then theirs, so the queue is as it was.
func TestUndosAfterAnOffLoopGetKeepTheOrder(t *testing.T) {
	srv, dial, hold := latchServer(t)
	a, b := dial(), dial()
	const size = 300 << 10
	for i := range 4 {
		if _, err := a.Write(request(t, uint64(10+i), "put", map[string]any{"kind": "queue", "name": "q",
			"item": bytes.Repeat([]byte{byte('1' + i)}, size)})); err != nil {
			t.Fatal(err)
		}
		if rep := readReply(t, a); rep.Err != nil {
			t.Fatal(rep.Err)
		}
	}
	gets := append(request(t, 101, "get", map[string]any{"kind": "queue", "name": "q"}),
		request(t, 102, "get", map[string]any{"kind": "queue", "name": "q"})...)
	if _, err := a.Write(gets); err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		n := 0
		for c := range srv.conns {
			if lp := c.lp.Load(); lp != nil {
				c.wmu.Lock()
				n += len(lp.out)
				c.wmu.Unlock()
			}
		}
		return n
	}
	for deadline := time.Now().Add(5 * time.Second); queued() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the gets' replies did not both wait in the output")
		}
	}
	letGo := hold()
	defer letGo()
	if _, err := a.Write(request(t, 103, "get", map[string]any{"kind": "queue", "name": "q"})); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // get 103 runs off the loop, waiting on the latch
	a.Close()
	time.Sleep(100 * time.Millisecond) // the loop ends a (EPOLLHUP): letGo's undos wait too
	letGo()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := b.Write(request(t, 4, "qsize", map[string]any{"kind": "queue", "name": "q"})); err != nil {
			t.Fatal(err)
		}
		if rep := readReply(t, b); rep.Err == nil && rep.Result.(int64) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the undone gets' items did not all come back")
		}
	}
	var order []byte
	for deadline := time.Now().Add(5 * time.Second); len(order) < 4 && time.Now().Before(deadline); {
		if _, err := b.Write(request(t, 5, "get", map[string]any{"kind": "queue", "name": "q"})); err != nil {
			t.Fatal(err)
		}
		rep := readReply(t, b)
		if rep.Err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		order = append(order, rep.Result.([]byte)[0])
	}
	if string(order) != "1234" {
		t.Fatalf("items came back in the order %q, want \"1234\"", order)
	}
}

// pingWithin sends a ping on conn, another connection of the loop, and
// fails t unless it is answered by limit after start: the loop was not
// held up (behind: by what it would have been).
func pingWithin(t *testing.T, conn net.Conn, start time.Time, limit time.Duration, behind string) {
	t.Helper()
	if _, err := conn.Write(request(t, 2, "ping", nil)); err != nil {
		t.Fatal(err)
	}
	if rep := readReply(t, conn); rep.ID != 2 || rep.Err != nil {
		t.Fatalf("ping: %+v", rep)
	}
	if waited := time.Since(start); waited > limit {
		t.Fatalf("another connection's ping was answered after %v, %s", waited, behind)
	}
}

// latchServer starts a server with the fast path, its one loop serving
// Unix connections from the first, and a queue q made by a connection of
// its own; it returns the server, a dialer, and hold, which has a live
// attached session hold q's ring latch until the function it returns is
// called.
func latchServer(t *testing.T) (*Server, func() net.Conn, func() (letGo func())) {
	t.Helper()
	mgr := manager.New(manager.DefaultConfig())
	seg, err := statemem.Create(64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() }) // after the server has stopped (cleanups run last first)
	mgr.EnableFastPath(seg)
	srv, dialLoop := startLoopServerOn(t, 1, mgr)
	dial := func() net.Conn {
		nc := dialLoop()
		t.Cleanup(func() { nc.Close() })
		_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
		return nc
	}
	maker := dial()
	if _, err := maker.Write(request(t, 1, "create", map[string]any{"kind": "queue", "name": "q"})); err != nil {
		t.Fatal(err)
	}
	if rep := readReply(t, maker); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	obj, err := mgr.Lookup(manager.KindQueue, "q")
	if err != nil {
		t.Fatal(err)
	}
	ring := obj.(*manager.Queue).Ring()
	if ring == nil {
		t.Fatal("the queue has no ring")
	}
	var mem []byte
	if err := ring.WithFD(func(fd int) (err error) {
		mem, err = unix.Mmap(fd, 0, statemem.RingHeader, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	holder, err := mgr.OpenSession(nil, 1, "holder")
	if err != nil {
		t.Fatal(err)
	}
	if !mgr.AttachFastPath(holder) {
		t.Fatal("attach")
	}
	latch := (*uint64)(unsafe.Pointer(&mem[ringOffLatch]))
	t.Cleanup(func() { atomic.StoreUint64(latch, 0) })
	return srv, dial, func() func() {
		atomic.StoreUint64(latch, uint64(holder.Slot()))
		return func() { atomic.StoreUint64(latch, 0) }
	}
}
