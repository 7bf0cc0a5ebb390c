package manager

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func item(i int) []byte { return []byte(fmt.Sprint("item-", i)) }

// getN gets n items without blocking and checks they are items from..from+n-1.
func expectItems(t *testing.T, q *Queue, from, n int) {
	t.Helper()
	ctx := testCtx(t)
	for i := from; i < from+n; i++ {
		got, err := q.Get(ctx, false, 0)
		if err != nil || string(got) != string(item(i)) {
			t.Fatalf("get: %q %v, want %q", got, err, item(i))
		}
	}
	if got, err := q.Get(ctx, false, 0); err != ErrEmpty {
		t.Fatalf("queue not empty: %q %v", got, err)
	}
}

func TestQueue(t *testing.T) { testQueue(t, newManager(t, DefaultConfig()), false) }

// testQueue runs the Queue semantics on m; ring: m's queues keep their
// items in shared rings (the fast path), where the status line differs and
// waiting socket clients are served in no set order.
func testQueue(t *testing.T, m *Manager, ring bool) {
	s := newSession(t, m)
	ctx := testCtx(t)
	newQ := func(name string, maxsize int64) *Queue {
		return create[*Queue](t, m, s, KindQueue, name, Params{MaxSize: maxsize})
	}

	t.Run("FIFO", func(t *testing.T) {
		q := newQ("q1", 0)
		for i := 0; i < 100; i++ {
			if err := q.Put(ctx, item(i), true, Forever); err != nil {
				t.Fatal(err)
			}
		}
		if q.Len() != 100 || q.Full() {
			t.Fatalf("len %d full %v", q.Len(), q.Full())
		}
		want := map[bool][2]string{false: {"100 items, 690 bytes, unbounded", "0 items, 0 bytes, unbounded"},
			true: {"100 items, 1600 bytes, unbounded, shared ring", "0 items, 0 bytes, unbounded, shared ring"}}[ring]
		if st, _ := q.Describe(); st != want[0] {
			t.Fatalf("describe %q", st)
		}
		expectItems(t, q, 0, 100)
		if st, _ := q.Describe(); st != want[1] {
			t.Fatalf("describe %q", st)
		}
	})

	t.Run("maxsize", func(t *testing.T) {
		q := newQ("q2", 2)
		q.Put(ctx, item(0), true, Forever)
		q.Put(ctx, item(1), true, Forever)
		if !q.Full() {
			t.Fatal("not full")
		}
		if err := q.Put(ctx, item(9), false, Forever); err != ErrFull {
			t.Fatalf("non-blocking put: %v", err)
		}
		if err := q.Put(ctx, item(9), true, 0); err != ErrFull {
			t.Fatalf("zero timeout put: %v", err)
		}
		start := time.Now()
		if err := q.Put(ctx, item(9), true, 30*time.Millisecond); err != ErrFull {
			t.Fatalf("timed put: %v", err)
		}
		if time.Since(start) < 30*time.Millisecond {
			t.Fatal("put gave up early")
		}
		waitWaiters(t, q, 0)
		expectItems(t, q, 0, 2)
	})

	t.Run("put blocks until get", func(t *testing.T) {
		q := newQ("q3", 1)
		q.Put(ctx, item(0), true, Forever)
		ch := async(func() (struct{}, error) { return struct{}{}, q.Put(ctx, item(1), true, Forever) })
		waitWaiters(t, q, 1)
		pending(t, ch, 10*time.Millisecond)
		got, err := q.Get(ctx, true, Forever)
		if err != nil || string(got) != string(item(0)) {
			t.Fatalf("get %q %v", got, err)
		}
		if r := recv(t, ch); r.err != nil {
			t.Fatal(r.err)
		}
		expectItems(t, q, 1, 1)
	})

	t.Run("get blocks until put", func(t *testing.T) {
		q := newQ("q4", 0)
		ch := async(func() ([]byte, error) { return q.Get(ctx, true, Forever) })
		waitWaiters(t, q, 1)
		pending(t, ch, 10*time.Millisecond)
		q.Put(ctx, item(7), true, Forever)
		if r := recv(t, ch); r.err != nil || string(r.v) != string(item(7)) {
			t.Fatalf("get %q %v", r.v, r.err)
		}
		if q.Len() != 0 {
			t.Fatal("the handed-over item is also in the queue")
		}
	})

	t.Run("get timeouts", func(t *testing.T) {
		q := newQ("q5", 0)
		if _, err := q.Get(ctx, false, Forever); err != ErrEmpty {
			t.Fatalf("non-blocking: %v", err)
		}
		if _, err := q.Get(ctx, true, 0); err != ErrEmpty {
			t.Fatalf("zero timeout: %v", err)
		}
		if _, err := q.Get(ctx, true, 20*time.Millisecond); err != ErrEmpty {
			t.Fatalf("timeout: %v", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		ch := async(func() ([]byte, error) { return q.Get(cctx, true, Forever) })
		waitWaiters(t, q, 1)
		cancel()
		if r := recv(t, ch); r.err != context.Canceled || r.v != nil {
			t.Fatalf("cancelled get: %q %v", r.v, r.err)
		}
		waitWaiters(t, q, 0)
	})

	t.Run("unget goes to the front", func(t *testing.T) {
		q := newQ("q6", 2)
		q.Put(ctx, item(1), true, Forever)
		q.Put(ctx, item(2), true, Forever)
		if err := q.Unget(item(0)); err != nil { // ignores maxsize
			t.Fatal(err)
		}
		if q.Len() != 3 {
			t.Fatalf("len %d", q.Len())
		}
		expectItems(t, q, 0, 3)
		// With a getter waiting, unget hands the item to it.
		ch := async(func() ([]byte, error) { return q.Get(ctx, true, Forever) })
		waitWaiters(t, q, 1)
		q.Unget(item(5))
		if r := recv(t, ch); string(r.v) != string(item(5)) {
			t.Fatalf("getter got %q", r.v)
		}
	})

	t.Run("getters FIFO", func(t *testing.T) {
		if ring {
			t.Skip("a ring's waiting socket clients are served in no set order")
		}
		q := newQ("q7", 0)
		const n = 6
		var chs []<-chan result[[]byte]
		for i := 0; i < n; i++ {
			chs = append(chs, async(func() ([]byte, error) { return q.Get(ctx, true, Forever) }))
			waitWaiters(t, q, i+1)
		}
		for i := 0; i < n; i++ {
			q.Put(ctx, item(i), true, Forever)
		}
		for i, ch := range chs {
			if r := recv(t, ch); string(r.v) != string(item(i)) {
				t.Fatalf("getter %d got %q", i, r.v)
			}
		}
	})

	t.Run("putters FIFO", func(t *testing.T) {
		if ring {
			t.Skip("a ring's waiting socket clients are served in no set order")
		}
		q := newQ("q8", 1)
		q.Put(ctx, item(0), true, Forever)
		const n = 5
		var chs []<-chan result[struct{}]
		for i := 1; i <= n; i++ {
			chs = append(chs, async(func() (struct{}, error) { return struct{}{}, q.Put(ctx, item(i), true, Forever) }))
			waitWaiters(t, q, i)
		}
		for i := 0; i <= n; i++ {
			got, err := q.Get(ctx, true, Forever)
			if err != nil || string(got) != string(item(i)) {
				t.Fatalf("get %d: %q %v", i, got, err)
			}
		}
		for _, ch := range chs {
			if r := recv(t, ch); r.err != nil {
				t.Fatal(r.err)
			}
		}
	})

	t.Run("maxsize over the limit", func(t *testing.T) {
		if _, _, err := m.Create(s, KindQueue, "huge", Params{MaxSize: DefaultConfig().MaxQueue + 1}); !isErr(err, ErrValue) {
			t.Fatalf("got %v", err)
		}
		if _, _, err := m.Create(s, KindJoinableQueue, "huge", Params{MaxSize: 1 << 62}); !isErr(err, ErrValue) {
			t.Fatalf("got %v", err)
		}
		q := newQ("negative", -5) // <= 0 is unbounded
		for i := 0; i < 10; i++ {
			if err := q.Put(ctx, item(i), false, 0); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// The JoinableQueue semantics, with the task counts in the daemon and in a
// ring.
func TestJoinableQueue(t *testing.T) {
	t.Run("daemon", func(t *testing.T) { testJoinableQueue(t, newManager(t, DefaultConfig()), false) })
	t.Run("ring", func(t *testing.T) { m, _ := fastManager(t); testJoinableQueue(t, m, true) })
}

func testJoinableQueue(t *testing.T, m *Manager, ring bool) {
	s := newSession(t, m)
	ctx := testCtx(t)
	q := create[*Queue](t, m, s, KindJoinableQueue, "jq", Params{})
	if q.Kind() != KindJoinableQueue {
		t.Fatal(q.Kind())
	}
	if (q.Ring() != nil) != ring {
		t.Fatalf("ring %v, want %v", q.Ring() != nil, ring)
	}
	if err := q.TaskDone(); !isErr(err, ErrValue) {
		t.Fatalf("task_done on an empty queue: %v", err)
	}
	if ok, err := q.Join(ctx, Forever); !ok || err != nil {
		t.Fatalf("join with nothing unfinished: %v %v", ok, err)
	}
	q.Put(ctx, item(0), true, Forever)
	q.Put(ctx, item(1), true, Forever)
	if q.Unfinished() != 2 {
		t.Fatalf("unfinished %d", q.Unfinished())
	}
	if ok, err := q.Join(ctx, 0); ok || err != nil {
		t.Fatalf("join with zero timeout: %v %v", ok, err)
	}
	ch := async(func() (bool, error) { return q.Join(ctx, Forever) })
	// The join is in place. (Not through Describe's count: a ring's counts
	// its joiners, between their waits, and a list's does not.)
	for deadline := time.Now().Add(bound); ; time.Sleep(100 * time.Microsecond) {
		q.mu.Lock()
		n := q.joiners.len()
		q.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d joiners, want 1", n)
		}
	}
	expectItems(t, q, 0, 2)
	q.TaskDone()
	pending(t, ch, 10*time.Millisecond)
	q.TaskDone()
	if r := recv(t, ch); !r.v || r.err != nil {
		t.Fatalf("join: %v %v", r.v, r.err)
	}
	if err := q.TaskDone(); !isErr(err, ErrValue) {
		t.Fatalf("extra task_done: %v", err)
	}
	plain := create[*Queue](t, m, s, KindQueue, "plain", Params{})
	if err := plain.TaskDone(); !isErr(err, ErrType) {
		t.Fatalf("task_done on a plain queue: %v", err)
	}
}
