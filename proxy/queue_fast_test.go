package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/metrics"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
	"golang.org/x/sys/unix"
)

// ringServer is a server with the fast path (so Queues get rings) and op
// metrics, to count what went over the socket.
type ringServer struct {
	path string
	srv  *server.Server
	m    *metrics.Metrics
}

func serveRing(t *testing.T) *ringServer {
	t.Helper()
	return serveRingWith(t, manager.DefaultConfig())
}

// serveRingWith is serveRing with the manager's configuration mcfg.
func serveRingWith(t *testing.T, mcfg manager.Config) *ringServer {
	t.Helper()
	seg, err := statemem.Create(256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	m := metrics.New()
	path, srv := serveWith(t, server.Config{Metrics: m}, mcfg)
	srv.Manager().EnableFastPath(seg)
	return &ringServer{path: path, srv: srv, m: m}
}

// ops counts the requests the daemon answered for op on queues.
func (rs *ringServer) ops(t *testing.T, op string) int {
	t.Helper()
	return rs.opsOf(t, op, wire.KindQueue, wire.KindJoinableQueue)
}

// opsOf counts the requests the daemon answered for op, of any of kinds
// (the kind label the daemon counts the op under).
func (rs *ringServer) opsOf(t *testing.T, op string, kinds ...string) int {
	t.Helper()
	mfs, err := rs.m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "syncmgr_ops_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if slices.Contains(kinds, labels["kind"]) && labels["op"] == op {
				n += int(mt.GetCounter().GetValue())
			}
		}
	}
	return n
}

// waitOps waits until ops(op) reaches want (the daemon counts a request
// just after its reply is sent) and returns it.
func (rs *ringServer) waitOps(t *testing.T, op string, want int) int {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d %s requests", want, op), func() bool { return rs.ops(t, op) >= want })
	return rs.ops(t, op)
}

// ring is the daemon's ring of the Queue name.
func (rs *ringServer) ring(t *testing.T, name string) *statemem.Ring {
	t.Helper()
	return rs.ringOf(t, manager.KindQueue, name)
}

// Offsets of a ring's header words (statemem/ring.go, docs/protocol.md).
const (
	ringOffLatch = 64
	ringOffTail  = 80
)

// ringWords maps r's header through its descriptor, as a process that
// scribbles on the ring would, and returns the u64 word at a header offset.
func ringWords(t *testing.T, r *statemem.Ring) func(off int) *uint64 {
	t.Helper()
	var mem []byte
	err := r.WithFD(func(fd int) (err error) {
		mem, err = unix.Mmap(fd, 0, statemem.RingHeader, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return func(off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }
}

// ringOf is the daemon's ring of the queue name of kind (a Queue or a
// JoinableQueue).
func (rs *ringServer) ringOf(t *testing.T, kind manager.Kind, name string) *statemem.Ring {
	t.Helper()
	o, err := rs.srv.Manager().Lookup(kind, name)
	if err != nil {
		t.Fatal(err)
	}
	r := o.(*manager.Queue).Ring()
	if r == nil {
		t.Fatalf("queue %q has no ring", name)
	}
	return r
}

// waitFor polls cond (a count of events, not a time) within bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func ringItems(n, from int) []any {
	out := make([]any, 0, n)
	for i := 0; i < n; i++ {
		switch i % 4 {
		case 0:
			out = append(out, int64(from+i))
		case 1:
			out = append(out, fmt.Sprintf("item %d", from+i))
		case 2:
			out = append(out, []byte(fmt.Sprintf("bytes %d", from+i)))
		default:
			out = append(out, []any{int64(from + i), 1.5, nil, true})
		}
	}
	return out
}

// A fast Go client puts and gets on the ring with no socket request; a
// socket client on the same queue sees one FIFO in both directions.
func TestQueueRingFastAndSocketShareOneFIFO(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	fast := dialC(t, rs.path, proxy.WithFastPath())
	sock := dialC(t, rs.path)
	fq, err := fast.Queue(ctx, "rq", 0)
	if err != nil {
		t.Fatal(err)
	}
	sq, _ := sock.Queue(ctx, "rq", 0)
	puts, gets, sizes := rs.ops(t, wire.OpPut), rs.ops(t, wire.OpGet), rs.ops(t, wire.OpQsize)

	want := ringItems(100, 0)
	for i, x := range want {
		var err error
		if i%2 == 0 {
			err = fq.Put(ctx, x)
		} else {
			err = fq.TryPut(ctx, x)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n, err := fq.Len(ctx); err != nil || n != 100 {
		t.Fatalf("fast Len %d %v", n, err)
	}
	if got := rs.ops(t, wire.OpPut) - puts; got != 0 {
		t.Fatalf("%d fast puts went over the socket", got)
	}
	if got := rs.ops(t, wire.OpQsize) - sizes; got != 0 {
		t.Fatalf("%d fast Len calls went over the socket", got)
	}
	for i, x := range want {
		got, err := sq.Get(ctx)
		if err != nil || !reflect.DeepEqual(got, x) {
			t.Fatalf("socket get %d: %#v %v, want %#v", i, got, err, x)
		}
	}

	// The reverse, interleaved with fast puts: one FIFO.
	want = ringItems(100, 1000)
	for i, x := range want {
		q := sq
		if i%3 == 0 {
			q = fq
		}
		if err := q.Put(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	gets = rs.waitOps(t, wire.OpGet, gets+100) // the socket client's
	for i, x := range want {
		var got any
		var err error
		if i%2 == 0 {
			got, err = fq.Get(ctx)
		} else {
			got, err = fq.TryGet(ctx)
		}
		if err != nil || !reflect.DeepEqual(got, x) {
			t.Fatalf("fast get %d: %#v %v, want %#v", i, got, err, x)
		}
	}
	if got := rs.ops(t, wire.OpGet) - gets; got != 0 {
		t.Fatalf("%d fast gets went over the socket", got)
	}
	if _, err := fq.TryGet(ctx); !errors.Is(err, proxy.ErrEmpty) {
		t.Fatalf("TryGet on an empty ring: %v", err)
	}
	if _, err := sq.TryGet(ctx); !errors.Is(err, proxy.ErrEmpty) {
		t.Fatalf("socket TryGet on an empty queue: %v", err)
	}
}

// When a fast Go producer outruns the ring (four rings' worth of items),
// the daemon keeps the newest items (RingFlagOver) and refills the ring as
// it drains: the puts past the ring's room go through the daemon, but a
// fast consumer's gets stay on the ring while it holds records, and all
// come back in order.
func TestQueueRingOverflowKeepsGetsOnTheRing(t *testing.T) {
	mcfg := manager.DefaultConfig()
	mcfg.QueueRingBytes = 256 << 10
	rs := serveRingWith(t, mcfg)
	ctx := bctx(t)
	fast := dialC(t, rs.path, proxy.WithFastPath())
	q, err := fast.Queue(ctx, "flood", 0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1024 // 1 KiB each: four rings' worth
	pad := string(make([]byte, 1000))
	for i := 0; i < n; i++ {
		if err := q.Put(ctx, fmt.Sprintf("%06d%s", i, pad)); err != nil {
			t.Fatal(err)
		}
	}
	if f := rs.ring(t, "flood").Flags(); f != statemem.RingFlagOver {
		t.Fatalf("flags %#x after the flood, want RingFlagOver", f)
	}
	gets := rs.ops(t, wire.OpGet)
	for i := 0; i < n; i++ {
		got, err := q.Get(ctx)
		if err != nil || got.(string)[:6] != fmt.Sprintf("%06d", i) {
			t.Fatalf("get %d: %.6v %v", i, got, err)
		}
	}
	if sock := rs.ops(t, wire.OpGet) - gets; sock > n/10 {
		t.Fatalf("%d of %d gets went over the socket while the daemon held the newest items", sock, n)
	}
	if f := rs.ring(t, "flood").Flags(); f != 0 {
		t.Fatalf("flags %#x once drained", f)
	}
}

// tooMany is the error of one task_done too many, on either path.
var tooMany = &wire.Error{Code: wire.CodeValueError}

// A fast Go client's JoinableQueue is on the ring: Put, TryPut, Get,
// TryGet, Len, TaskDone and Join make no socket request, and a socket
// client of the same queue sees the same items and task counts (its
// task_done pays the fast client's debt, and the fast Join sees it).
func TestJoinableQueueRingNoRoundTrips(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	fast := dialC(t, rs.path, proxy.WithFastPath())
	sock := dialC(t, rs.path)
	jq, err := fast.JoinableQueue(ctx, "jq", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !jq.FastPath() {
		t.Fatal("the JoinableQueue is not on the ring")
	}
	sq, _ := sock.JoinableQueue(ctx, "jq", 0)
	if sq.FastPath() {
		t.Fatal("a socket client's JoinableQueue on the ring")
	}
	socketOps := []string{wire.OpPut, wire.OpGet, wire.OpQsize, wire.OpTaskDone, wire.OpJoin}
	before := map[string]int{}
	for _, op := range socketOps {
		before[op] = rs.ops(t, op)
	}
	want := ringItems(40, 0)
	for i, x := range want {
		put := jq.Put
		if i%2 == 1 {
			put = jq.TryPut
		}
		if err := put(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := jq.Len(ctx); err != nil || n != 40 {
		t.Fatalf("Len %d %v", n, err)
	}
	for i, x := range want {
		get := jq.Get
		if i%2 == 1 {
			get = jq.TryGet
		}
		if v, err := get(ctx); err != nil || !reflect.DeepEqual(v, x) {
			t.Fatalf("get %d: %#v %v, want %#v", i, v, err, x)
		}
	}
	if err := jq.Join(ctx0(t, 0)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("join with 40 unfinished: %v", err)
	}
	for i := 0; i < 40; i++ {
		if i == 39 {
			dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			err := jq.Join(dctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("join with one unfinished: %v", err)
			}
		}
		if err := jq.TaskDone(ctx); err != nil {
			t.Fatalf("task_done %d: %v", i, err)
		}
	}
	if err := jq.Join(ctx); err != nil {
		t.Fatalf("join with none unfinished: %v", err)
	}
	if err := jq.TaskDone(ctx); !errors.Is(err, tooMany) {
		t.Fatalf("one task_done too many: %v", err)
	}
	if err := jq.Join(ctx); err != nil {
		t.Fatalf("join after a refused task_done: %v", err)
	}
	for _, op := range socketOps {
		if n := rs.ops(t, op) - before[op]; n != 0 {
			t.Fatalf("%d fast %s requests went over the socket", n, op)
		}
	}

	// The fast client gets, the socket client marks done: one count.
	if err := sq.Put(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if v, err := jq.Get(ctx); err != nil || v != "s" {
		t.Fatalf("fast get of a socket put: %v %v", v, err)
	}
	if err := sq.Join(ctx0(t, 20*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("socket join with one unfinished: %v", err)
	}
	if err := sq.TaskDone(ctx); err != nil {
		t.Fatal(err)
	}
	if err := jq.Join(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sq.TaskDone(ctx); !errors.Is(err, tooMany) {
		t.Fatalf("socket task_done too many: %v", err)
	}
	if err := jq.TaskDone(ctx); !errors.Is(err, tooMany) {
		t.Fatalf("fast task_done too many after the socket's: %v", err)
	}
}

// ctx0 is a context whose deadline is d from now (0: already passed).
func ctx0(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(bctx(t), d)
	t.Cleanup(cancel)
	return ctx
}

// A blocked fast Join sleeps on the ring (counted in its waiter table) and
// is woken by the last TaskDone, fast or over the socket; a Join whose
// context is cancelled while it sleeps answers the context's error and
// takes nothing (the count stays, and the waiter count goes back to 0).
func TestJoinableQueueRingJoinWokenAndCancelled(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	b := dialC(t, rs.path, proxy.WithFastPath())
	s := dialC(t, rs.path)
	aq, _ := a.JoinableQueue(ctx, "jw", 0)
	bq, _ := b.JoinableQueue(ctx, "jw", 0)
	sq, _ := s.JoinableQueue(ctx, "jw", 0)
	if !aq.FastPath() || !bq.FastPath() {
		t.Fatal("the JoinableQueue is not on the ring")
	}
	r := rs.ringOf(t, manager.KindJoinableQueue, "jw")
	joins := rs.ops(t, wire.OpJoin)
	for i, finisher := range []*proxy.JoinableQueue{bq, sq} {
		for k := 0; k < 2; k++ {
			if err := bq.Put(ctx, int64(k)); err != nil {
				t.Fatal(err)
			}
			if _, err := bq.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// Cancelled while asleep: nothing taken.
		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- aq.Join(cctx) }()
		waitFor(t, "the joiner to sleep on the ring", func() bool { return r.Waiting() == 1 })
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled join: %v", err)
		}
		waitFor(t, "the waiter count to drop", func() bool { return r.Waiting() == 0 })
		if n := r.UnfinishedNow(); n != 2 {
			t.Fatalf("%d unfinished after a cancelled join, want 2", n)
		}
		// Woken by the last task_done, not before it.
		done := make(chan error, 1)
		go func() { done <- aq.Join(ctx) }()
		waitFor(t, "the joiner to sleep on the ring", func() bool { return r.Waiting() == 1 })
		if err := finisher.TaskDone(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("round %d: join returned %v with one task unfinished", i, err)
		default:
		}
		if err := finisher.TaskDone(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("round %d: woken join: %v", i, err)
			}
		case <-time.After(bound):
			t.Fatalf("round %d: join not woken by the last task_done", i)
		}
		waitFor(t, "the waiter count to drop", func() bool { return r.Waiting() == 0 })
	}
	if n := rs.ops(t, wire.OpJoin) - joins; n != 0 {
		t.Fatalf("%d fast joins went over the socket", n)
	}
}

// A blocked fast Get sleeps on the ring (counted in its waiter table) and
// is woken by another client's put, fast or over the socket.
func TestQueueRingBlockingGetWoken(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	b := dialC(t, rs.path, proxy.WithFastPath())
	s := dialC(t, rs.path)
	aq, _ := a.Queue(ctx, "wq", 0)
	bq, _ := b.Queue(ctx, "wq", 0)
	sq, _ := s.Queue(ctx, "wq", 0)
	r := rs.ring(t, "wq")
	gets := rs.ops(t, wire.OpGet)
	for i, put := range []*proxy.Queue{bq, sq} {
		got := make(chan any, 1)
		go func() {
			v, err := aq.Get(ctx)
			if err != nil {
				got <- err
				return
			}
			got <- v
		}()
		waitFor(t, "the getter to sleep on the ring", func() bool { return r.Waiting() == 1 })
		if err := put.Put(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
		select {
		case v := <-got:
			if v != int64(i) {
				t.Fatalf("woken get %d: %v", i, v)
			}
		case <-time.After(bound):
			t.Fatalf("get %d not woken by a put", i)
		}
		waitFor(t, "the waiter count to drop", func() bool { return r.Waiting() == 0 })
	}
	if n := rs.ops(t, wire.OpGet) - gets; n != 0 {
		t.Fatalf("%d blocking fast gets went over the socket", n)
	}
}

// A fast Get cancelled while it sleeps takes nothing; one whose deadline
// passes answers ErrEmpty.
func TestQueueRingCancelledGetTakesNothing(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	b := dialC(t, rs.path, proxy.WithFastPath())
	aq, _ := a.Queue(ctx, "cq", 0)
	bq, _ := b.Queue(ctx, "cq", 0)
	r := rs.ring(t, "cq")

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		v, err := aq.Get(cctx)
		if err == nil {
			err = fmt.Errorf("got %v", v)
		}
		errc <- err
	}()
	waitFor(t, "the getter to sleep", func() bool { return r.Waiting() == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled get: %v", err)
	}
	waitFor(t, "the waiter count to drop", func() bool { return r.Waiting() == 0 })
	if err := bq.Put(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	if v, err := bq.TryGet(ctx); err != nil || v != "kept" {
		t.Fatalf("the item after a cancelled get: %v %v", v, err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer dcancel()
	if _, err := aq.Get(dctx); !errors.Is(err, proxy.ErrEmpty) {
		t.Fatalf("get past its deadline: %v", err)
	}
	done, dn := context.WithCancel(ctx)
	dn()
	if err := bq.Put(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := aq.Get(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("get with a cancelled context: %v", err)
	}
	if n, _ := bq.Len(ctx); n != 1 {
		t.Fatalf("Len %d after a get with a cancelled context", n)
	}
}

// maxsize (from queue_attach's reply) bounds fast puts: TryPut answers
// ErrFull, Put waits until a get makes room or its deadline passes.
func TestQueueRingMaxsize(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	s := dialC(t, rs.path)
	aq, _ := a.Queue(ctx, "mq", 3)
	sq, _ := s.Queue(ctx, "mq", 3)
	r := rs.ring(t, "mq")
	puts := rs.ops(t, wire.OpPut)
	for i := 0; i < 3; i++ {
		if err := aq.TryPut(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := aq.TryPut(ctx, int64(3)); !errors.Is(err, proxy.ErrFull) {
		t.Fatalf("TryPut on a full queue: %v", err)
	}
	if err := sq.TryPut(ctx, int64(3)); !errors.Is(err, proxy.ErrFull) {
		t.Fatalf("socket TryPut on a full queue: %v", err)
	}
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := aq.Put(dctx, int64(3)); !errors.Is(err, proxy.ErrFull) {
		t.Fatalf("Put past its deadline on a full queue: %v", err)
	}
	if n, err := aq.Len(ctx); err != nil || n != 3 {
		t.Fatalf("Len %d %v", n, err)
	}
	if n := rs.waitOps(t, wire.OpPut, puts+1) - puts; n != 1 { // the socket client's TryPut
		t.Fatalf("%d puts went over the socket, want 1", n)
	}
	errc := make(chan error, 1)
	go func() { errc <- aq.Put(ctx, int64(3)) }()
	waitFor(t, "the putter to sleep", func() bool { return r.Waiting() == 1 })
	if v, err := sq.Get(ctx); err != nil || v != int64(0) {
		t.Fatalf("get %v %v", v, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("woken put: %v", err)
	}
	for i := 1; i <= 3; i++ {
		if v, err := aq.Get(ctx); err != nil || v != int64(i) {
			t.Fatalf("get %d: %v %v", i, v, err)
		}
	}
}

// Items too large for the ring, and puts that find no room left in it, go
// to the daemon; the FIFO holds across.
func TestQueueRingLargeItemsThroughDaemon(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	aq, _ := a.Queue(ctx, "lq", 0)
	r := rs.ring(t, "lq")
	big := make([]byte, r.Inline()+1)
	for i := range big {
		big[i] = byte(i)
	}
	puts := rs.ops(t, wire.OpPut)
	want := []any{"small", big, int64(7)}
	for _, x := range want {
		if err := aq.Put(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	rs.waitOps(t, wire.OpPut, puts+1) // the item over the inline maximum
	for i, x := range want {
		if v, err := aq.Get(ctx); err != nil || !reflect.DeepEqual(v, x) {
			t.Fatalf("get %d: %v", i, err)
		}
	}
}

// An item that does not decode stays at the head: the error costs nothing.
func TestQueueRingUndecodableItemStays(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	s := dialC(t, rs.path)
	aq, _ := a.Queue(ctx, "bq", 0)
	bad := []byte{0xC1, 0xc1} // the msgpack tag, then a never-used msgpack byte
	args := map[string]any{wire.ArgKind: wire.KindQueue, wire.ArgName: "bq", wire.ArgItem: bad}
	if _, err := s.Call(ctx, wire.OpPut, args, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if v, err := aq.TryGet(ctx); err == nil {
			t.Fatalf("an undecodable item decoded to %v", v)
		}
	}
	if n, _ := aq.Len(ctx); n != 1 {
		t.Fatalf("Len %d after failed gets", n)
	}
	got, err := s.Call(ctx, wire.OpGet, map[string]any{wire.ArgKind: wire.KindQueue, wire.ArgName: "bq", wire.ArgBlock: false}, nil)
	if err != nil || !reflect.DeepEqual(got, bad) {
		t.Fatalf("the bad item over the socket: %v %v", got, err)
	}
}

// A scribbled ring makes fast ops go to the daemon, which reports the
// queue damaged; the daemon keeps serving everyone else.
func TestQueueRingScribbledGoesToDaemon(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	aq, _ := a.Queue(ctx, "sq", 0)
	if err := aq.Put(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	atomic.StoreUint64(ringWords(t, rs.ring(t, "sq"))(ringOffTail), 1<<39+3)
	gets := rs.ops(t, wire.OpGet)
	if v, err := aq.TryGet(ctx); err == nil {
		t.Fatalf("a get from a scribbled ring answered %v", v)
	}
	rs.waitOps(t, wire.OpGet, gets+1) // the get from a scribbled ring goes to the daemon
	if err := aq.Put(ctx, "y"); err == nil {
		t.Fatal("a damaged queue took a put")
	}
	other, err := a.Queue(ctx, "other", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Put(ctx, "z"); err != nil {
		t.Fatal(err)
	}
	if v, err := other.Get(ctx); err != nil || v != "z" {
		t.Fatalf("another queue after the damage: %v %v", v, err)
	}
}

// Fast and socket producers and consumers hammer one queue: every item is
// got exactly once, and each producer's items come in its order.
func TestQueueRingConcurrentMixed(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	const producers, per = 4, 300
	var qs []*proxy.Queue
	for i := 0; i < producers; i++ {
		var opts []proxy.Option
		if i%2 == 0 {
			opts = append(opts, proxy.WithFastPath())
		}
		q, err := dialC(t, rs.path, opts...).Queue(ctx, "hq", 16)
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, q)
	}
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(q *proxy.Queue, p int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				if err := q.Put(ctx, []any{int64(p), int64(i)}); err != nil {
					t.Error(err)
					return
				}
			}
		}(qs[p], p)
	}
	// Each consumer sees each producer's items in order; together they
	// see every item once.
	var mu sync.Mutex
	seen := make(map[[2]int64]int)
	for c := 0; c < producers; c++ {
		wg.Add(1)
		go func(q *proxy.Queue) {
			defer wg.Done()
			last := make([]int64, producers)
			for i := range last {
				last[i] = -1
			}
			for i := 0; i < per; i++ {
				v, err := q.Get(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				x := v.([]any)
				p, n := x[0].(int64), x[1].(int64)
				if n <= last[p] {
					t.Errorf("producer %d: item %d after %d", p, n, last[p])
				}
				last[p] = n
				mu.Lock()
				seen[[2]int64{p, n}]++
				mu.Unlock()
			}
		}(qs[c])
	}
	wg.Wait()
	if len(seen) != producers*per {
		t.Fatalf("%d distinct items got, want %d", len(seen), producers*per)
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("item %v got %d times", k, n)
		}
	}
}

// A closed client's Queue does not touch the ring: its ops answer
// ErrClosed, and the items stay for others.
func TestQueueRingClosedClient(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	b := dialC(t, rs.path, proxy.WithFastPath())
	aq, _ := a.Queue(ctx, "closed", 0)
	bq, _ := b.Queue(ctx, "closed", 0)
	if !aq.FastPath() || !bq.FastPath() {
		t.Fatal("the queue is not on the ring")
	}
	if err := bq.Put(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if _, err := aq.TryGet(ctx); !errors.Is(err, proxy.ErrClosed) {
		t.Fatalf("TryGet after Close: %v", err)
	}
	if err := aq.Put(ctx, "lost"); !errors.Is(err, proxy.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if _, err := aq.Len(ctx); !errors.Is(err, proxy.ErrClosed) {
		t.Fatalf("Len after Close: %v", err)
	}
	if n, _ := bq.Len(ctx); n != 1 {
		t.Fatalf("Len %d", n)
	}
	if v, err := bq.Get(ctx); err != nil || v != "kept" {
		t.Fatalf("get %v %v", v, err)
	}
}

// SYNCMGR_FASTPATH=0 keeps a fast client's Queue on the socket.
func TestQueueRingOffByEnv(t *testing.T) {
	t.Setenv("SYNCMGR_FASTPATH", "0")
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	q, err := a.Queue(ctx, "env", 0)
	if err != nil {
		t.Fatal(err)
	}
	if q.FastPath() {
		t.Fatal("the queue is on the ring with SYNCMGR_FASTPATH=0")
	}
	puts := rs.ops(t, wire.OpPut)
	if err := q.Put(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	rs.waitOps(t, wire.OpPut, puts+1)
	if v, err := q.Get(ctx); err != nil || v != "x" {
		t.Fatalf("get %v %v", v, err)
	}
	jq, err := a.JoinableQueue(ctx, "envj", 0)
	if err != nil {
		t.Fatal(err)
	}
	if jq.FastPath() {
		t.Fatal("the JoinableQueue is on the ring with SYNCMGR_FASTPATH=0")
	}
	if err := jq.Put(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	if _, err := jq.Get(ctx); err != nil {
		t.Fatal(err)
	}
	joins := rs.ops(t, wire.OpJoin)
	if err := jq.TaskDone(ctx); err != nil {
		t.Fatal(err)
	}
	if err := jq.Join(ctx); err != nil {
		t.Fatal(err)
	}
	rs.waitOps(t, wire.OpJoin, joins+1)
}
