package server_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

// batchServers runs fn against a daemon whose queues keep their items in
// the daemon, and one whose queues have a ring (the fast path on): the
// batch ops must mean the same on both.
func batchServers(t *testing.T, fn func(t *testing.T, ts *testServer), opts ...func(*serverOpts)) {
	t.Run("daemon", func(t *testing.T) { fn(t, startServer(t, opts...)) })
	t.Run("ring", func(t *testing.T) {
		ts, _ := startFastServer(t, opts...)
		fn(t, ts)
	})
}

// fullAtDeadline: the daemon's answer (full) or the client's own deadline,
// whichever came first.
func fullAtDeadline(err error) bool {
	return errors.Is(err, proxy.ErrFull) || errors.Is(err, context.DeadlineExceeded)
}

func mustLen(t *testing.T, q *proxy.Queue, want int) {
	t.Helper()
	n, err := q.Len(ctxT(t))
	if err != nil || n != want {
		t.Fatalf("Len = %d, %v; want %d", n, err, want)
	}
}

func getAll(t *testing.T, q *proxy.Queue, max int) []any {
	t.Helper()
	got, err := q.TryGetMany(ctxT(t), max)
	if err != nil {
		t.Fatalf("TryGetMany: %v", err)
	}
	return got
}

// A put_many is all or nothing: a full queue (now or at the deadline) and
// a batch larger than maxsize store none of it; a batch that fits goes in
// whole, in order, after what was there.
func TestPutManyAllOrNothing(t *testing.T) {
	batchServers(t, func(t *testing.T, ts *testServer) {
		c := ts.dial(t)
		q, err := c.Queue(ctxT(t), "q", 3)
		if err != nil {
			t.Fatal(err)
		}
		var we *wire.Error
		if err := q.PutMany(ctxT(t), []any{1, 2, 3, 4}); !errors.As(err, &we) || we.Code != wire.CodeValueError {
			t.Fatalf("a batch over maxsize: %v, want a value error", err)
		}
		mustLen(t, q, 0)
		if err := q.Put(ctxT(t), "x"); err != nil {
			t.Fatal(err)
		}
		if err := q.TryPutMany(ctxT(t), []any{"a", "b", "c"}); !errors.Is(err, proxy.ErrFull) {
			t.Fatalf("TryPutMany on a queue with room for 2 of 3: %v, want ErrFull", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := q.PutMany(ctx, []any{"a", "b", "c"}); !fullAtDeadline(err) {
			t.Fatalf("PutMany at its deadline: %v, want ErrFull", err)
		}
		mustLen(t, q, 1)
		if err := q.PutMany(ctxT(t), []any{"a", "b"}); err != nil {
			t.Fatal(err)
		}
		if got := getAll(t, q, 10); !reflect.DeepEqual(got, []any{"x", "a", "b"}) {
			t.Fatalf("got %v", got)
		}
	})
}

// A batch waiting for room goes in once all of it fits, and a putter
// behind a batch that gave up is let in as soon as it fits.
func TestPutManyWaitsForRoomForAll(t *testing.T) {
	batchServers(t, func(t *testing.T, ts *testServer) {
		c, c2 := ts.dial(t), ts.dial(t)
		q, _ := c.Queue(ctxT(t), "w", 3)
		q2, _ := c2.Queue(ctxT(t), "w", 3)
		if err := q.PutMany(ctxT(t), []any{1, 2, 3}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- q2.PutMany(ctxT(t), []any{4, 5}) }()
		time.Sleep(50 * time.Millisecond) // let the batch start waiting (the test holds either way)
		if v, err := q.Get(ctxT(t)); err != nil || v != int64(1) {
			t.Fatalf("Get = %v, %v", v, err)
		}
		select {
		case err := <-done:
			t.Fatalf("a batch of 2 went in with room for 1: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if v, err := q.Get(ctxT(t)); err != nil || v != int64(2) {
			t.Fatalf("Get = %v, %v", v, err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(bound):
			t.Fatal("the batch did not go in once there was room for all of it")
		}
		if got := getAll(t, q, 10); !reflect.DeepEqual(got, []any{int64(3), int64(4), int64(5)}) {
			t.Fatalf("got %v", got)
		}

		// A batch that gives up lets the single putter behind it in.
		if err := q.PutMany(ctxT(t), []any{1, 2}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		go func() { done <- q2.PutMany(ctx, []any{3, 4}) }()
		time.Sleep(50 * time.Millisecond) // let the batch start waiting (the test holds either way)
		single := make(chan error, 1)
		go func() { single <- q.Put(ctxT(t), 9) }()
		if err := <-done; !fullAtDeadline(err) {
			t.Fatalf("the batch at its deadline: %v, want ErrFull", err)
		}
		select {
		case err := <-single:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(bound):
			t.Fatal("the putter behind a batch that gave up was not let in")
		}
		if got := getAll(t, q, 10); !reflect.DeepEqual(got, []any{int64(1), int64(2), int64(9)}) {
			t.Fatalf("got %v", got)
		}
	})
}

// get_many takes what is there up to its count, in order, and a
// JoinableQueue owes every item it took.
func TestGetManyTakesUpToItsCount(t *testing.T) {
	batchServers(t, func(t *testing.T, ts *testServer) {
		c := ts.dial(t)
		q, _ := c.Queue(ctxT(t), "g", 0)
		if _, err := q.TryGetMany(ctxT(t), 5); !errors.Is(err, proxy.ErrEmpty) {
			t.Fatalf("TryGetMany of an empty queue: %v", err)
		}
		if _, err := q.TryGetMany(ctxT(t), 0); err == nil {
			t.Fatal("GetMany of 0 items did not fail")
		}
		items := make([]any, 100)
		for i := range items {
			items[i] = int64(i)
		}
		if err := q.PutMany(ctxT(t), items); err != nil {
			t.Fatal(err)
		}
		if got := getAll(t, q, 64); !reflect.DeepEqual(got, items[:64]) {
			t.Fatalf("got %v", got)
		}
		if got := getAll(t, q, 64); !reflect.DeepEqual(got, items[64:]) {
			t.Fatalf("got %v", got)
		}

		jq, _ := c.JoinableQueue(ctxT(t), "jg", 0)
		if err := jq.PutMany(ctxT(t), []any{1, 2, 3}); err != nil {
			t.Fatal(err)
		}
		if got := getAll(t, &jq.Queue, 10); len(got) != 3 {
			t.Fatalf("got %v", got)
		}
		for i := 0; i < 3; i++ {
			if err := jq.TaskDone(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		}
		if err := jq.TaskDone(ctxT(t)); err == nil {
			t.Fatal("a fourth task_done for three items did not fail")
		}
		if err := jq.Join(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// A get_many's reply fits one frame: items past the frame's budget stay at
// the head for the next call.
func TestGetManyReplyFitsTheFrame(t *testing.T) {
	batchServers(t, func(t *testing.T, ts *testServer) {
		c := ts.dial(t)
		q, _ := c.Queue(ctxT(t), "f", 0)
		big := make([]any, 3)
		for i := range big {
			big[i] = bytesOf(byte('a'+i), 1500)
		}
		for _, b := range big { // one put_many of all three would be over the frame limit
			if err := q.Put(ctxT(t), b); err != nil {
				t.Fatal(err)
			}
		}
		if got := getAll(t, q, 10); len(got) != 2 || !reflect.DeepEqual(got, big[:2]) {
			t.Fatalf("first get_many took %d items, want 2", len(got))
		}
		if got := getAll(t, q, 10); !reflect.DeepEqual(got, big[2:]) {
			t.Fatalf("the item past the budget was not the next head")
		}
	}, func(o *serverOpts) { o.cfg.MaxFrame = 4096 })
}

// A get_many whose items add up to a large reply is written as pieces
// (the items themselves, not copies): the client gets every item, small
// and large, intact and in order, on both stores.
func TestGetManyLargeReplyIsIntact(t *testing.T) {
	batchServers(t, func(t *testing.T, ts *testServer) {
		c := ts.dial(t)
		q, _ := c.Queue(ctxT(t), "l", 0)
		var want []any
		for i, n := range []int{3, 200 << 10, 10, 4 << 10, 1 << 20, 70 << 10, 1} {
			it := bytesOf(byte('a'+i), n)
			want = append(want, it)
			if err := q.Put(ctxT(t), it); err != nil {
				t.Fatal(err)
			}
		}
		if got := getAll(t, q, 100); !reflect.DeepEqual(got, want) {
			t.Fatalf("get_many returned %d items, not the %d put, or not intact", len(got), len(want))
		}
	})
}

func bytesOf(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// Requests on one connection are answered as they complete, each under its
// own id: a get_many parked on an empty queue, then a put_many behind it
// on the same connection, which answers first and feeds the get_many.
func TestBatchRepliesMatchTheirRequests(t *testing.T) {
	batchServers(t, func(t *testing.T, ts *testServer) {
		r := ts.raw(t, []byte("batch-session"))
		r.send(1, wire.OpCreate, map[string]any{"kind": "queue", "name": "p"})
		if rep := r.recv(); rep.Err != nil {
			t.Fatal(rep.Err)
		}
		r.send(2, wire.OpGetMany, map[string]any{"kind": "queue", "name": "p", "n": 10, "timeout": 5.0})
		r.noReply(50 * time.Millisecond)
		raw, _ := wire.Marshal([][]byte{[]byte("a"), []byte("b"), []byte("c")})
		r.send(3, wire.OpPutMany, map[string]any{"kind": "queue", "name": "p", "items": raw})
		got := map[uint64]any{}
		for len(got) < 2 {
			rep := r.recv()
			if rep.Err != nil {
				t.Fatalf("reply %d: %v", rep.ID, rep.Err)
			}
			got[rep.ID] = rep.Result
		}
		if got[3] != nil {
			t.Fatalf("put_many answered %v", got[3])
		}
		items, _ := got[2].([]any)
		if len(items) == 0 || fmt.Sprint(items[0]) != fmt.Sprint([]byte("a")) {
			t.Fatalf("get_many answered %v", got[2])
		}
	})
}

// A connection dropped with a put_many parked on a full queue stores none
// of it, and one dropped mid-frame stores nothing: no partial batch.
func TestDroppedConnectionLeavesNoPartialBatch(t *testing.T) {
	batchServers(t, func(t *testing.T, ts *testServer) {
		c := ts.dial(t)
		q, _ := c.Queue(ctxT(t), "d", 2)
		if err := q.Put(ctxT(t), 0); err != nil {
			t.Fatal(err)
		}
		r := ts.raw(t, []byte("dropper"))
		raw, _ := wire.Marshal([][]byte{[]byte("\x01"), []byte("\x02")})
		r.send(1, wire.OpPutMany, map[string]any{"kind": "queue", "name": "d", "items": raw, "timeout": 5.0})
		r.noReply(50 * time.Millisecond)
		r.nc.Close()
		ts.waitSessions(t, 1)
		if v, err := q.Get(ctxT(t)); err != nil || v != int64(0) {
			t.Fatalf("Get = %v, %v", v, err)
		}
		time.Sleep(50 * time.Millisecond) // room for the whole batch now, had it survived
		mustLen(t, q, 0)

		// Half a frame, then the connection drops.
		r2 := ts.raw(t, []byte("dropper2"))
		body, _ := wire.EncodeRequest(2, wire.OpPutMany, map[string]any{"kind": "queue", "name": "d", "items": raw})
		if _, err := r2.nc.Write(body[:len(body)-3]); err != nil {
			t.Fatal(err)
		}
		r2.nc.Close()
		ts.waitSessions(t, 1)
		mustLen(t, q, 0)
	})
}

// Bad batches cost nothing: a malformed items argument, and a put_many on a
// queue that is not there.
func TestPutManyBadRequests(t *testing.T) {
	ts := startServer(t)
	r := ts.raw(t, []byte("bad-batch"))
	r.send(1, wire.OpCreate, map[string]any{"kind": "queue", "name": "b"})
	r.recv()
	for i, items := range []any{[]byte{0x93, 0xc4, 0x01}, []byte("not msgpack"), "a string", nil} {
		r.send(uint64(10+i), wire.OpPutMany, map[string]any{"kind": "queue", "name": "b", "items": items})
		if rep := r.recv(); rep.Err == nil || rep.Err.Code != wire.CodeBadRequest {
			t.Fatalf("items %v: %+v, want bad_request", items, rep.Err)
		}
	}
	r.send(20, wire.OpGetMany, map[string]any{"kind": "queue", "name": "b", "n": -1})
	if rep := r.recv(); rep.Err == nil || rep.Err.Code != wire.CodeValueError {
		t.Fatalf("n -1: %+v", rep.Err)
	}
	r.send(21, wire.OpQsize, map[string]any{"kind": "queue", "name": "b"})
	if rep := r.recv(); rep.Result != int64(0) {
		t.Fatalf("qsize after bad batches: %v", rep.Result)
	}
}
