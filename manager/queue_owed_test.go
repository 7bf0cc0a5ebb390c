package manager

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// A consumer whose session ends with items it got and did not mark done:
// they are marked done for it, so join returns; task_done by another
// session pays another's debt first; an undone get takes its debt back.
func TestJoinableQueueDeadConsumer(t *testing.T) {
	t.Run("daemon", func(t *testing.T) { testJoinableQueueDeadConsumer(t, newManager(t, DefaultConfig())) })
	t.Run("ring", func(t *testing.T) { m, _ := fastManager(t); testJoinableQueueDeadConsumer(t, m) })
}

func testJoinableQueueDeadConsumer(t *testing.T, m *Manager) {
	prod := newSession(t, m)
	cons := newSession(t, m)
	ctx := testCtx(t)
	q := create[*Queue](t, m, prod, KindJoinableQueue, "jq", Params{})
	for i := 0; i < 4; i++ {
		if err := q.Put(ctx, item(i), false, 0); err != nil {
			t.Fatal(err)
		}
	}
	get := func(s *Session) Grant {
		g, err := q.GetGrant(ctx, false, 0)
		if err != nil {
			t.Fatal(err)
		}
		q.Owe(&g, s)
		return g
	}
	g0, g1, g2 := get(cons), get(cons), get(cons)
	g0.Commit()
	g1.Commit()
	g2.Undo() // back at the front, the debt with it
	if err := q.TaskDoneBy(cons); err != nil {
		t.Fatal(err)
	}
	if q.Unfinished() != 3 {
		t.Fatalf("unfinished %d, want 3", q.Unfinished())
	}
	done := make(chan bool, 1)
	go func() {
		ok, _ := q.Join(ctx, Forever)
		done <- ok
	}()
	m.CloseSession(cons) // it still owed one item: marked done
	if q.Unfinished() != 2 {
		t.Fatalf("unfinished %d after the consumer's end, want 2", q.Unfinished())
	}
	// The remaining two items, got by the producer's session and finished.
	g3, g4 := get(prod), get(prod)
	g3.Commit()
	g4.Commit()
	for i := 0; i < 2; i++ {
		if err := q.TaskDoneBy(prod); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("join failed")
		}
	case <-time.After(bound):
		t.Fatal("join still waits")
	}
	if st, _ := q.Describe(); !strings.Contains(st, "1 marked done when their consumer's session ended") {
		t.Fatalf("describe %q", st)
	}
	if err := q.TaskDoneBy(prod); !isErr(err, ErrValue) {
		t.Fatalf("one task_done too many: %v", err)
	}
}

// A JoinableQueue ring whose client died in the middle of a get or a
// task_done, holding the latch: the daemon finishes the op's second store
// when its commit happened (the journal), and then marks done what the dead
// session owed, so the unfinished count is right whatever the step.
func TestJoinableRingJournalRepair(t *testing.T) {
	const (
		offJProof, offJOp, offJHolder, offLatch, offHead, offDone = 40, 48, 56, 64, 88, 112
	)
	for _, tc := range []struct {
		name      string
		committed bool
		get       bool // a get (else a task_done)
		want      int64
	}{
		{"get killed before its commit", false, true, 3},   // the item stays queued: 3 unfinished
		{"get killed after its commit", true, true, 2},     // got and owed: marked done at the end
		{"done killed before its commit", false, false, 2}, // one got and owed (marked done), nothing done
		{"done killed after its commit", true, false, 2},   // done, its debt paid by the repair
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := fastManager(t)
			ctx := testCtx(t)
			prod := newSession(t, m)
			cons := newSession(t, m)
			if !m.AttachFastPath(cons) {
				t.Fatal("attach")
			}
			q := create[*Queue](t, m, prod, KindJoinableQueue, "jq", Params{})
			words := ringWords(t, q.Ring())
			word := func(off int) uint64 { return atomic.LoadUint64(words(off)) }
			set := func(off int, x uint64) { atomic.StoreUint64(words(off), x) }
			for i := 0; i < 3; i++ {
				if err := q.Put(ctx, item(i), false, 0); err != nil {
					t.Fatal(err)
				}
			}
			slot := uint64(cons.Slot())
			if !tc.get { // the consumer got one item (as a client: head moved, owed 1)
				g, err := q.GetGrant(ctx, false, 0)
				if err != nil {
					t.Fatal(err)
				}
				q.Owe(&g, cons)
				g.Commit()
			}
			// The client's op, up to its kill: latch, journal, maybe the commit.
			set(offLatch, slot)
			if tc.get {
				next := word(offHead) + 1<<40 + 16 // one 8-byte-header record of item(0)'s padded length
				set(offJProof, next)
				set(offJHolder, slot)
				set(offJOp, statemem.RingJournalGet<<56|slot<<32|1)
				if tc.committed {
					set(offHead, next)
				}
			} else {
				done := word(offDone) + 1
				set(offJProof, done)
				set(offJHolder, slot)
				set(offJOp, statemem.RingJournalDone<<56|slot<<32|0)
				if tc.committed {
					set(offDone, done)
				}
			}
			m.CloseSession(cons)
			if got := q.Unfinished(); got != tc.want {
				t.Fatalf("unfinished %d, want %d", got, tc.want)
			}
			if word(offLatch) != 0 || word(offJOp) != 0 {
				t.Fatalf("latch %d journal %#x left", word(offLatch), word(offJOp))
			}
			// The rest: every item still queued is got and done; join returns.
			for {
				g, err := q.GetGrant(ctx, false, 0)
				if err == ErrEmpty {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				q.Owe(&g, prod)
				g.Commit()
				if err := q.TaskDoneBy(prod); err != nil {
					t.Fatal(err)
				}
			}
			if ok, err := q.Join(ctx, 0); !ok || err != nil {
				t.Fatalf("join: %v %v (unfinished %d)", ok, err, q.Unfinished())
			}
			if err := q.TaskDoneBy(prod); !isErr(err, ErrValue) {
				t.Fatalf("one task_done too many: %v", err)
			}
		})
	}
}

// A JoinableQueue ring whose puts overflow into the daemon (over): the
// unfinished count includes the items the daemon keeps, whether they reach
// the ring before they are got or are got straight from over, and every
// task_done takes exactly one off.
func TestJoinableRingOverflowCounts(t *testing.T) {
	m := smallRingManager(t)
	ctx := testCtx(t)
	s := newSession(t, m)
	q := create[*Queue](t, m, s, KindJoinableQueue, "jq-over", Params{})
	r := q.Ring()
	const n = 1200 // ~1.2 MB of 1 KiB items: most of them in over
	for i := 0; i < n; i++ {
		if err := q.Put(ctx, append(item(i), make([]byte, 1000)...), false, 0); err != nil {
			t.Fatal(err)
		}
	}
	if r.Flags() != statemem.RingFlagOver || q.Unfinished() != n {
		t.Fatalf("flags %#x unfinished %d, want OVER and %d", r.Flags(), q.Unfinished(), n)
	}
	for i := 0; i < n; i++ {
		g, err := q.GetGrant(ctx, false, 0)
		if err != nil {
			t.Fatal(i, err)
		}
		q.Owe(&g, s)
		g.Commit()
		if err := q.TaskDoneBy(s); err != nil {
			t.Fatal(i, err)
		}
		if u := q.Unfinished(); u != int64(n-1-i) {
			t.Fatalf("after %d items got and done: unfinished %d", i+1, u)
		}
	}
	if ok, err := q.Join(ctx, 0); !ok || err != nil {
		t.Fatalf("join: %v %v", ok, err)
	}
	if err := q.TaskDoneBy(s); !isErr(err, ErrValue) {
		t.Fatalf("one task_done too many: %v", err)
	}
	if st, _ := q.Describe(); !strings.Contains(st, "0 unfinished") {
		t.Fatalf("describe %q", st)
	}
}
