package manager

import (
	"testing"
)

// TestSlotsReuse: slot ids are small, the lowest free one first, and an id
// is reused only after its session ended and every pin on it was dropped.
func TestSlotsReuse(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s1, s2, s3 := newSession(t, m), newSession(t, m), newSession(t, m)
	if s1.Slot() != 1 || s2.Slot() != 2 || s3.Slot() != 3 {
		t.Fatalf("slots %d %d %d, want 1 2 3", s1.Slot(), s2.Slot(), s3.Slot())
	}
	var order []string
	s2.OnEnd(func() { order = append(order, "first") })
	unpin := func() {}
	s2.OnEnd(func() {
		order = append(order, "second")
		var ok bool
		unpin, ok = m.Slots().Pin(s2.Slot()) // e.g. words in shared memory still name it
		if !ok {
			t.Error("pin of a live slot failed")
		}
	})
	m.CloseSession(s2)
	if len(order) != 2 || order[0] != "second" || order[1] != "first" {
		t.Fatalf("end hooks ran %v, want the last registered first", order)
	}
	if s2.OnEnd(func() {}) {
		t.Fatal("OnEnd on an ended session reported success")
	}
	s4 := newSession(t, m)
	if s4.Slot() != 4 {
		t.Fatalf("pinned slot 2 was reused: new session got %d", s4.Slot())
	}
	unpin()
	unpin() // idempotent
	s5 := newSession(t, m)
	if s5.Slot() != 2 {
		t.Fatalf("after unpin the new session got slot %d, want 2", s5.Slot())
	}
	if _, ok := m.Slots().Pin(6); ok {
		t.Fatal("pinned a slot nobody holds")
	}
}

// TestSessionEndRunsHooksAfterRelease: end hooks see the session's holds
// already released.
func TestSessionEndRunsHooksAfterRelease(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s := newSession(t, m)
	l := create[*Lock](t, m, s, KindLock, "hl", Params{})
	l.Acquire(testCtx(t), s, 1, true, Forever)
	locked := true
	s.OnEnd(func() { locked = l.Locked() })
	m.CloseSession(s)
	if locked {
		t.Fatal("the end hook ran before the session's lock was released")
	}
}
