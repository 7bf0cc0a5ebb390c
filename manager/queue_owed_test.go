package manager

import (
	"strings"
	"testing"
	"time"
)

// A consumer whose session ends with items it got and did not mark done:
// they are marked done for it, so join returns; task_done by another
// session pays another's debt first; an undone get takes its debt back.
func TestJoinableQueueDeadConsumer(t *testing.T) {
	m := newManager(t, DefaultConfig())
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
