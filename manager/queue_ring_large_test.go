package manager

import (
	"bytes"
	"errors"
	"testing"

	"github.com/syncmgr/syncmgr/statemem"
)

// A Queue's ring has the configured capacity (64 MiB by default), keeps
// items up to a quarter of it inline, and the sweeper gives back its pages
// past the hot window once a burst of large items is drained.
func TestQueueRingLargeItemsAndTrim(t *testing.T) {
	m, _ := fastManager(t)
	q := ringQueue(t, m, "large", 0)
	r := q.Ring()
	if r.Capacity() != DefaultQueueRingBytes || r.Inline() != DefaultQueueRingBytes/4 {
		t.Fatalf("capacity %d inline %d, want 64 MiB and 16 MiB", r.Capacity(), r.Inline())
	}
	ctx := testCtx(t)
	// Items just under SocketKeepMin: the daemon copies them into the ring
	// (larger ones it would keep, named by external records).
	var want [][]byte
	const size, n = SocketKeepMin - 1024, (32 << 20) / (SocketKeepMin - 1024)
	for i := 0; i < n; i++ {
		it := bytes.Repeat([]byte{byte(i)}, size)
		if err := q.Put(ctx, it, false, 0); err != nil {
			t.Fatal(err)
		}
		want = append(want, it)
	}
	if items, _, err := r.Len(); err != nil || items != n {
		t.Fatalf("the ring holds %d items (%v), want all %d inline", items, err, n)
	}
	if a := r.Allocated(); a < 32<<20 {
		t.Fatalf("the ring holds %d bytes of memory after 32 MiB of items", a)
	}
	f := m.fast
	f.trimQueues()
	f.trimQueues()
	if a := r.Allocated(); a < 32<<20 {
		t.Fatalf("a ring that holds items was trimmed to %d bytes", a)
	}
	for i, w := range want {
		got, err := q.Get(ctx, false, 0)
		if err != nil || !bytes.Equal(got, w) {
			t.Fatalf("item %d: %d bytes, %v", i, len(got), err)
		}
	}
	f.trimQueues() // sees a new seq: not idle yet
	f.trimQueues()
	if a := r.Allocated(); a > statemem.RingHeader+statemem.RingHot+1<<20 {
		t.Fatalf("a drained idle ring still holds %d bytes of memory", a)
	}
	// It works after (and a socket client's item of SocketKeepMin or more
	// stays in the daemon, named by an external record).
	for i := 0; i < 3; i++ {
		if err := q.Put(ctx, bytes.Repeat([]byte{9}, 1<<20), false, 0); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		if got, err := q.Get(ctx, false, 0); err != nil || len(got) != 1<<20 || got[0] != 9 || got[len(got)-1] != 9 {
			t.Fatalf("after the trim: %d bytes, %v", len(got), err)
		}
	}
}

// The ring capacity follows Config.QueueRingBytes.
func TestQueueRingBytesConfig(t *testing.T) {
	m := smallRingManager(t)
	q := ringQueue(t, m, "small", 0)
	if c := q.Ring().Capacity(); c != smallRing {
		t.Fatalf("capacity %d, want %d", c, smallRing)
	}
}

// The ring holds at most --max-object-bytes, and what the daemon keeps for
// a queue with a ring is charged with the ring's bytes counted, so a queue's
// items stay under the per-object limit wherever they are.
func TestQueueRingChargesCountTheRing(t *testing.T) {
	seg, err := statemem.Create(64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	cfg := DefaultConfig()
	cfg.MaxObjectBytes = 1<<20 + 1000
	m := newManager(t, cfg)
	m.EnableFastPath(seg)
	q := ringQueue(t, m, "charged", 0)
	if c := q.Ring().Capacity(); c != 1<<20 {
		t.Fatalf("capacity %d, want the limit rounded down to a power of two", c)
	}
	ctx := testCtx(t)
	for i := 0; i < 3; i++ { // inline: ~600 KiB in the ring, charged nowhere else
		if err := q.Put(ctx, bytes.Repeat([]byte{1}, 200<<10), false, 0); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte{2}, 300<<10) // over the inline limit: the daemon keeps it
	if err := q.Put(ctx, big, false, 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Put(ctx, big, false, 0); !errors.Is(err, ErrLimit) {
		t.Fatalf("a put past the limit with the ring counted: %v, want ErrLimit", err)
	}
	if q.Len() != 4 {
		t.Fatalf("len %d, want 4", q.Len())
	}
}

// A socket client's item of SocketKeepMin bytes or more stays in the
// daemon while no client has the ring (the ring holds an 8-byte external
// record for it, in its place): no copy into the ring and none out for a
// socket getter. Smaller ones are copied into the ring, and order holds
// across both. Once the ring is passed to a client (whose gets then take
// large items from shared memory, not from the daemon), large items are
// copied into it too, in the same order.
func TestQueueRingKeepsLargeSocketItems(t *testing.T) {
	m, _ := fastManager(t)
	q := ringQueue(t, m, "keep", 0)
	r := q.Ring()
	ctx := testCtx(t)
	small, big := []byte("small"), bytes.Repeat([]byte{7}, SocketKeepMin)
	for _, it := range [][]byte{small, big, small} {
		if err := q.Put(ctx, it, false, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, used := r.Peek(); used > 1024 {
		t.Fatalf("the ring uses %d bytes: the large item was copied into it", used)
	}
	for i, want := range [][]byte{small, big, small} {
		got, err := q.Get(ctx, false, 0)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("item %d: %d bytes, %v", i, len(got), err)
		}
	}

	q.RingPassed(7)
	big2 := bytes.Repeat([]byte{8}, 2*SocketKeepMin)
	for _, it := range [][]byte{big, small, big2} {
		if err := q.Put(ctx, it, false, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, used := r.Peek(); used < uint64(len(big)+len(big2)) {
		t.Fatalf("the ring uses %d bytes: a large item stayed in the daemon though a client has the ring", used)
	}
	for i, want := range [][]byte{big, small, big2} {
		got, err := q.Get(ctx, false, 0)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("item %d after the ring was passed: %d bytes, %v", i, len(got), err)
		}
	}
}

// A batch whose next item is over its byte budget stops before that item
// and leaves it where it is, in the ring: moved to the front, it would set
// RingFlagDaemon and send every client's op to the daemon until the daemon
// had handed it out (the reply budget of a client that has the ring, whose
// gets through the daemon then went one item per round trip).
func TestQueueRingBatchStopsBeforeAnItemOverBudget(t *testing.T) {
	m, _ := fastManager(t)
	q := ringQueue(t, m, "budget", 0)
	q.RingPassed(7)
	if !q.HasRing(7) || q.HasRing(8) {
		t.Fatal("HasRing does not follow RingPassed")
	}
	r := q.Ring()
	ctx := testCtx(t)
	var want [][]byte
	for i := 0; i < 4; i++ {
		it := bytes.Repeat([]byte{byte(i)}, 2*SocketKeepMin)
		if err := q.Put(ctx, it, false, 0); err != nil {
			t.Fatal(err)
		}
		want = append(want, it)
	}
	g, err := q.GetManyGrant(ctx, 10, SocketKeepMin, false, 0)
	if err != nil || len(g.Items()) != 1 || !bytes.Equal(g.Items()[0], want[0]) {
		t.Fatalf("got %d items (%v), want the first alone", len(g.Items()), err)
	}
	g.Commit()
	if f := r.Flags(); f&statemem.RingFlagDaemon != 0 {
		t.Fatalf("flags %#x: the item over the budget left the ring for the daemon's front", f)
	}
	if items, _, err := r.Len(); err != nil || items != 3 {
		t.Fatalf("the ring holds %d items (%v), want the other 3", items, err)
	}
	g, err = q.GetManyGrant(ctx, 10, 64<<20, false, 0)
	if err != nil || len(g.Items()) != 3 {
		t.Fatalf("then %d items (%v), want 3", len(g.Items()), err)
	}
	for i, it := range g.Items() {
		if !bytes.Equal(it, want[i+1]) {
			t.Fatalf("item %d out of order", i+1)
		}
	}
	g.Commit()
}
