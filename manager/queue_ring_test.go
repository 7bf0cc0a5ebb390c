package manager

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/syncmgr/syncmgr/statemem"
	"golang.org/x/sys/unix"
)

// Offsets of a ring's header words (statemem/ring.go, docs/protocol.md).
const (
	ringOffLatch = 64
	ringOffTail  = 80
	ringOffHead  = 88
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

// The Queue semantics with the items in a shared ring.
func TestQueueRing(t *testing.T) {
	m, _ := fastManager(t)
	testQueue(t, m, true)
}

// smallRing is the ring capacity of smallRingManager's queues: small, so
// that tests fill it.
const smallRing = 256 << 10

func smallRingManager(t *testing.T) *Manager {
	t.Helper()
	seg, err := statemem.Create(64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	cfg := DefaultConfig()
	cfg.QueueRingBytes = smallRing
	m := newManager(t, cfg)
	m.EnableFastPath(seg)
	return m
}

func ringQueue(t *testing.T, m *Manager, name string, maxsize int64) *Queue {
	t.Helper()
	q := create[*Queue](t, m, newSession(t, m), KindQueue, name, Params{MaxSize: maxsize})
	if q.Ring() == nil {
		t.Fatal("the queue has no ring")
	}
	return q
}

// Items too large for the ring (kept by the daemon, named by external
// records), items that find the ring full (kept after it, the daemon flag
// set) and ungot items (kept before it) all stay in one FIFO with the
// ring's items, and the flag is cleared once the daemon holds nothing.
func TestQueueRingOverflowKeepsOrder(t *testing.T) {
	m := smallRingManager(t)
	q := ringQueue(t, m, "over", 0)
	ctx := testCtx(t)
	big := bytes.Repeat([]byte("B"), smallRing/2)
	var want [][]byte
	for i := 0; i < 3000; i++ { // ~3000 * 1 KiB: three rings' worth
		it := bytes.Repeat([]byte{byte(i)}, 1000)
		if i%500 == 7 {
			it = append([]byte(nil), big...)
			it[0] = byte(i)
		}
		if err := q.Put(ctx, it, false, 0); err != nil {
			t.Fatal(err)
		}
		want = append(want, it)
	}
	if q.Ring().Flags() != statemem.RingFlagOver {
		t.Fatal("puts past the ring's room did not set the daemon flag")
	}
	if err := q.Unget([]byte("front")); err != nil {
		t.Fatal(err)
	}
	want = append([][]byte{[]byte("front")}, want...)
	if q.Len() != len(want) {
		t.Fatalf("len %d, want %d", q.Len(), len(want))
	}
	for i, w := range want {
		got, err := q.Get(ctx, false, 0)
		if err != nil || !bytes.Equal(got, w) {
			t.Fatalf("item %d: %d bytes %v, want %d bytes", i, len(got), err, len(w))
		}
	}
	if _, err := q.Get(ctx, false, 0); err != ErrEmpty {
		t.Fatalf("after the last item: %v", err)
	}
	if f := q.Ring().Flags(); f != 0 {
		t.Fatalf("flags %#x after the daemon's items were all got", f)
	}
	if m.UsedBytes() != 0 {
		t.Fatalf("%d bytes still counted", m.UsedBytes())
	}
}

// A latch left by a session that ended is taken over; a ring whose words
// were scribbled on fails the queue with an error, and nothing panics.
func TestQueueRingLatchAndCorruption(t *testing.T) {
	m, _ := fastManager(t)
	q := ringQueue(t, m, "scribbled", 0)
	ctx := testCtx(t)
	word := ringWords(t, q.Ring())
	atomic.StoreUint64(word(ringOffLatch), 77) // no session has slot 77
	if err := q.Put(ctx, []byte("x"), false, 0); err != nil {
		t.Fatalf("put after a dead latch: %v", err)
	}
	atomic.StoreUint64(word(ringOffTail), 1<<39+3)
	if _, err := q.Get(ctx, false, 0); err == nil {
		t.Fatal("a get from a scribbled ring did not fail")
	}
	if err := q.Put(ctx, []byte("x"), false, 0); err == nil {
		t.Fatal("the failed queue took a put")
	}
	if q.Ring() != nil {
		t.Fatal("a failed queue still offers its ring")
	}
}

// Socket getters and putters waiting on a ring are woken by each other's
// changes (the watcher), with no item lost or doubled.
func TestQueueRingDaemonWaiters(t *testing.T) {
	m, _ := fastManager(t)
	q := ringQueue(t, m, "waiters", 4)
	ctx := testCtx(t)
	const n = 2000
	var wg sync.WaitGroup
	got := make(chan []byte, n)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n/4; i++ {
				it, err := q.Get(ctx, true, Forever)
				if err != nil {
					t.Error(err)
					return
				}
				got <- it
			}
		}()
	}
	for i := 0; i < n; i++ {
		if err := q.Put(ctx, item(i), true, Forever); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(got)
	seen := map[string]bool{}
	for it := range got {
		if seen[string(it)] {
			t.Fatalf("%q got twice", it)
		}
		seen[string(it)] = true
	}
	if len(seen) != n {
		t.Fatalf("%d items got, want %d", len(seen), n)
	}
}

// A deleted Queue's ring is closed and, once no goroutine uses it,
// unmapped; its waiting socket clients get ErrDeleted, and the many rings
// of short-lived queues do not pile up in the daemon.
func TestQueueRingDeleted(t *testing.T) {
	m, _ := fastManager(t)
	ctx := testCtx(t)
	before := ringMaps(t)
	for i := 0; i < 200; i++ {
		q := ringQueue(t, m, "gone", 0)
		if err := q.Put(ctx, []byte("x"), false, 0); err != nil {
			t.Fatal(err)
		}
		r := q.Ring()
		var ch <-chan result[[]byte]
		if i == 0 {
			q.Get(ctx, false, 0)
			ch = async(func() ([]byte, error) { return q.Get(ctx, true, Forever) })
			waitWaiters(t, q, 1)
		}
		if !m.Delete("gone") {
			t.Fatal("delete failed")
		}
		if ch != nil {
			if r := recv(t, ch); !isErr(r.err, ErrDeleted) {
				t.Fatalf("waiting get: %v", r.err)
			}
		}
		if _, err := q.Get(ctx, false, 0); !isErr(err, ErrDeleted) {
			t.Fatalf("get after delete: %v", err)
		}
		if n, b := r.Peek(); n != 0 || b != 0 || r.Flags() != statemem.RingFlagDaemon {
			t.Fatalf("closed ring reads %d items %d bytes flags %#x", n, b, r.Flags())
		}
	}
	if after := ringMaps(t); after > before {
		t.Fatalf("%d ring mappings left after deleting every queue (%d before)", after, before)
	}
}

// ringMaps counts this process's mappings of queue rings.
func ringMaps(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "syncmgr-queue")
}

// ringClientGet takes the head record as a same-host client does, from the
// shared ring alone (the daemon not asked); ok is false when the ring is
// empty.
func ringClientGet(t *testing.T, r *statemem.Ring) ([]byte, bool) {
	t.Helper()
	if r.Lock(func(uint32) bool { return false }) != nil {
		t.Fatal("ring closed")
	}
	kind, p, ok, err := r.Get()
	r.Unlock(ok)
	if err != nil || ok && kind != statemem.RecItem {
		t.Fatalf("client get: kind %d %d bytes, %v", kind, len(p), err)
	}
	return p, ok
}

// While only over holds items the ring's flags are RingFlagOver (clients'
// gets stay on the ring), and a consumer that drains the ring by itself
// finds it refilled by the daemon's watcher, in order, until over is empty;
// then the flags are clear and the watcher ends. An undone get sets
// RingFlagDaemon on top.
func TestQueueRingOverRefilledWhileClientsDrain(t *testing.T) {
	m := smallRingManager(t)
	q := ringQueue(t, m, "refill", 0)
	ctx := testCtx(t)
	const n = 1200 // ~1.2 MB: four rings' worth of 1 KiB records
	for i := 0; i < n; i++ {
		if err := q.Put(ctx, append(item(i), bytes.Repeat([]byte("."), 1000)...), false, 0); err != nil {
			t.Fatal(err)
		}
	}
	r := q.Ring()
	if f := r.Flags(); f != statemem.RingFlagOver {
		t.Fatalf("flags %#x after puts past the ring's room, want OVER only", f)
	}
	var got [][]byte
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < n {
		p, ok := ringClientGet(t, r)
		if ok {
			got = append(got, p)
			continue
		}
		if f := r.Flags(); f == 0 {
			t.Fatalf("ring empty and flags clear after %d of %d items", len(got), n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ring was not refilled from over (%d of %d items got)", len(got), n)
		}
		time.Sleep(time.Millisecond)
	}
	for i, p := range got {
		if !bytes.HasPrefix(p, append(item(i), "."...)) {
			t.Fatalf("item %d out of order: %.12q", i, p)
		}
	}
	if f := r.Flags(); f != 0 {
		t.Fatalf("flags %#x once over is empty", f)
	}
	if !waitFor(func() bool { return !watching(q) }) {
		t.Fatal("the watcher goroutine did not end once over was empty")
	}
	if err := q.Unget([]byte("front")); err != nil {
		t.Fatal(err)
	}
	if f := r.Flags(); f != statemem.RingFlagDaemon {
		t.Fatalf("flags %#x after an undone get, want DAEMON", f)
	}
	if it, err := q.Get(ctx, false, 0); err != nil || string(it) != "front" || r.Flags() != 0 {
		t.Fatalf("get after the undo: %q %v, flags %#x", it, err, r.Flags())
	}
	if m.UsedBytes() != 0 {
		t.Fatalf("%d bytes still counted", m.UsedBytes())
	}
}

func waitFor(cond func() bool) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// A put through the daemon while a socket client's get waits on an empty
// ring is handed to that getter, as on a queue without a ring: the ring is
// not written (its seq does not move). A JoinableQueue counts the handed
// item as unfinished. An undone get hands its item to a waiting getter too.
// A getter that timed out takes nothing: the next put goes into the ring.
func TestQueueRingHandsPutsToWaitingGetters(t *testing.T) {
	for _, kind := range []Kind{KindQueue, KindJoinableQueue} {
		t.Run(string(kind), func(t *testing.T) {
			m, _ := fastManager(t)
			s := newSession(t, m)
			q := create[*Queue](t, m, s, kind, "hand", Params{})
			r := q.Ring()
			ctx := testCtx(t)
			for i, put := range []func(it []byte) error{
				func(it []byte) error { return q.Put(ctx, it, false, 0) },
				q.Unget,
			} {
				ch := async(func() ([]byte, error) { return q.Get(ctx, true, Forever) })
				waitWaiters(t, q, 1)
				seq := r.Seq()
				if err := put(item(i)); err != nil {
					t.Fatal(err)
				}
				if got := recv(t, ch); got.err != nil || string(got.v) != string(item(i)) {
					t.Fatalf("waiting get: %q %v, want %q", got.v, got.err, item(i))
				}
				if n, _ := r.Peek(); r.Seq() != seq || n != 0 || r.Flags() != 0 || q.Len() != 0 {
					t.Fatalf("after a hand-over: seq %d (was %d), %d records, flags %#x, len %d", r.Seq(), seq, n, r.Flags(), q.Len())
				}
			}
			if kind == KindJoinableQueue {
				if u := q.Unfinished(); u != 1 { // the put counts; the undone get's item was counted when it was put
					t.Fatalf("unfinished %d after one handed put, want 1", u)
				}
				if err := q.TaskDoneBy(s); err != nil {
					t.Fatal(err)
				}
				if ok, err := q.Join(ctx, 0); !ok || err != nil {
					t.Fatalf("join: %v %v", ok, err)
				}
			}
			if _, err := q.Get(ctx, true, 10*time.Millisecond); err != ErrEmpty {
				t.Fatalf("timed get: %v", err)
			}
			waitWaiters(t, q, 0)
			if err := q.Put(ctx, []byte("kept"), false, 0); err != nil {
				t.Fatal(err)
			}
			if n, _ := r.Peek(); n != 1 {
				t.Fatalf("a put after the getter timed out: %d records in the ring, want 1", n)
			}
			if got, ok := ringClientGet(t, r); !ok || string(got) != "kept" {
				t.Fatalf("client get %q %v", got, ok)
			}
		})
	}
}

// watching reports whether the ring's watcher goroutine runs.
func watching(q *Queue) bool {
	q.mu.Lock()
	qr := q.store.(*ringStore)
	q.mu.Unlock()
	qr.wmu.Lock()
	defer qr.wmu.Unlock()
	return qr.running
}

// ringClientPut puts a record as a same-host client does, by itself.
func ringClientPut(t *testing.T, r *statemem.Ring, it []byte) {
	t.Helper()
	if r.Lock(func(uint32) bool { return false }) != nil {
		t.Fatal("ring closed")
	}
	r.Put(statemem.RecItem, it)
	r.Unlock(true)
}

// A ring no session was passed (only socket clients use the queue) runs no
// watcher for its daemon waiters: the daemon's own changes wake them. Once
// the ring is passed to a session, a waiting socket get is woken by a
// client's put at once (the watcher), until that session ends. A change by
// a process the daemon does not know of still reaches a waiter within
// lonePoll.
func TestQueueRingWatcherOnlyForPassedRings(t *testing.T) {
	m, _ := fastManager(t)
	q := ringQueue(t, m, "watch", 0)
	r := q.Ring()
	ctx := testCtx(t)
	get := func() <-chan result[[]byte] {
		ch := async(func() ([]byte, error) { return q.Get(ctx, true, Forever) })
		waitWaiters(t, q, 1)
		return ch
	}
	within := func(ch <-chan result[[]byte], want string, d time.Duration) {
		t.Helper()
		select {
		case got := <-ch:
			if got.err != nil || string(got.v) != want {
				t.Fatalf("get %q %v, want %q", got.v, got.err, want)
			}
		case <-time.After(d):
			t.Fatalf("the waiting get did not see %q within %v", want, d)
		}
	}

	ch := get()
	if watching(q) {
		t.Fatal("a watcher runs for a ring no session was passed")
	}
	if err := q.Put(ctx, []byte("socket"), false, 0); err != nil {
		t.Fatal(err)
	}
	within(ch, "socket", bound)

	ch = get()
	ringClientPut(t, r, []byte("unknown writer"))
	within(ch, "unknown writer", bound) // lonePoll, at most
	if watching(q) {
		t.Fatal("a watcher started without a session passed the ring")
	}

	defer func(d time.Duration) { lonePoll = d }(lonePoll)
	lonePoll = time.Hour // from here on only the watcher or the daemon wakes a waiter in time
	q.RingPassed(7)
	ch = get()
	if !waitFor(func() bool { return watching(q) }) {
		t.Fatal("no watcher for a waiter once a session has the ring")
	}
	ringClientPut(t, r, []byte("client"))
	within(ch, "client", bound)

	m.fast.releaseQueueSlots(7)
	ch = get()
	if !waitFor(func() bool { return !watching(q) }) {
		t.Fatal("the watcher still runs after the last session the ring was passed to ended")
	}
	if err := q.Put(ctx, []byte("after"), false, 0); err != nil {
		t.Fatal(err)
	}
	within(ch, "after", bound)
}

// A put_many's items are views of their request's frame (the server
// passes them uncopied): a small item the daemon keeps (a list store's,
// or one that found the ring full) is its own copy, so the frame's bytes
// changing afterwards, or the frame being let go, changes no item.
func TestPutManyKeepsItsOwnCopies(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    func(*testing.T) *Manager
		fill int // items put first: the ring's room used up
	}{
		{"list", func(t *testing.T) *Manager { return newManager(t, DefaultConfig()) }, 0},
		{"ring full", smallRingManager, smallRing / 1000},
	} {
		// Small items, and large ones that are each a quarter of their
		// frame: kept as views, either would keep the whole frame alive
		// while charged for itself alone.
		for _, size := range []int{8, SocketKeepMin + 1} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, size), func(t *testing.T) {
				m := tc.m(t)
				q := create[*Queue](t, m, newSession(t, m), KindQueue, "own", Params{})
				ctx := testCtx(t)
				for i := 0; i < tc.fill; i++ {
					if err := q.Put(ctx, bytes.Repeat([]byte{'f'}, 1000), false, 0); err != nil {
						t.Fatal(err)
					}
				}
				n := 64
				if size > 8 {
					n = 4
				}
				frame := bytes.Repeat([]byte("abcdefgh"), n*size/8+1)
				batch := make([][]byte, n)
				for i := range batch {
					batch[i] = frame[i*size : (i+1)*size]
				}
				want := make([]string, n)
				for i, it := range batch {
					want[i] = string(it)
				}
				if _, err := q.PutManyGrant(ctx, batch, false, 0); err != nil {
					t.Fatal(err)
				}
				for i := range frame {
					frame[i] = 'X'
				}
				for i := 0; i < tc.fill; i++ {
					if _, err := q.Get(ctx, false, 0); err != nil {
						t.Fatal(err)
					}
				}
				for i := 0; i < n; i++ {
					got, err := q.Get(ctx, false, 0)
					if err != nil {
						t.Fatal(err)
					}
					if string(got) != want[i] {
						t.Fatalf("item %d (%d bytes) changed with the batch's frame: a view of it", i, len(got))
					}
				}
			})
		}
	}
}
