package manager

import (
	"testing"
	"time"
)

// TestSessionEndReleases: a session that ends releases its Lock, RLock and
// semaphore units, and the next waiter of another session proceeds at once.
func TestSessionEndReleases(t *testing.T) {
	m := newManager(t, DefaultConfig())
	dying, other := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	l := create[*Lock](t, m, dying, KindLock, "lock", Params{})
	r := create[*RLock](t, m, dying, KindRLock, "rlock", Params{})
	sem := create[*Semaphore](t, m, dying, KindSemaphore, "sem", Params{Value: 3})
	bsem := create[*Semaphore](t, m, dying, KindBoundedSemaphore, "bsem", Params{Value: 1})

	l.Acquire(ctx, dying, 1, true, Forever)
	for i := 0; i < 3; i++ {
		r.Acquire(ctx, dying, 1, true, Forever) // nested three deep
	}
	for i := 0; i < 3; i++ {
		sem.Acquire(ctx, dying, 1, true, Forever)
	}
	bsem.Acquire(ctx, dying, 1, true, Forever)
	if got := dying.Holds(); got != 1+1+3+1 {
		t.Fatalf("holds %d", got)
	}
	_, sessions := m.Snapshot(0)
	if len(sessions) != 2 || sessions[0].Holds != 6 {
		t.Fatalf("snapshot %+v", sessions)
	}

	lw := async(func() (bool, error) { return l.Acquire(ctx, other, 2, true, Forever) })
	rw := async(func() (bool, error) { return r.Acquire(ctx, other, 2, true, Forever) })
	sw := async(func() (bool, error) { return sem.Acquire(ctx, other, 2, true, Forever) })
	bw := async(func() (bool, error) { return bsem.Acquire(ctx, other, 2, true, Forever) })
	for _, o := range []Object{l, r, sem, bsem} {
		waitWaiters(t, o, 1)
	}
	pending(t, lw, 10*time.Millisecond)

	m.CloseSession(dying)
	select {
	case <-dying.Done():
	default:
		t.Fatal("Done not closed")
	}
	for name, ch := range map[string]<-chan result[bool]{"lock": lw, "rlock": rw, "sem": sw, "bsem": bw} {
		if res := recv(t, ch); !res.v || res.err != nil {
			t.Fatalf("%s waiter: %v %v", name, res.v, res.err)
		}
	}
	if dying.Holds() != 0 {
		t.Fatalf("ended session still holds %d", dying.Holds())
	}
	if sem.Value() != 2 || bsem.Value() != 0 || other.Holds() != 4 {
		t.Fatalf("sem %d bsem %d other holds %d", sem.Value(), bsem.Value(), other.Holds())
	}
	if st, _ := l.Describe(); st != "locked by session 2 thread 2" {
		t.Fatalf("lock state %q", st)
	}
	// The bounded semaphore can still not be over-released.
	bsem.Release(other, 2)
	if err := bsem.Release(other, 2); !isErr(err, ErrValue) {
		t.Fatalf("bounded over-release after session end: %v", err)
	}
	m.CloseSession(other)
	if l.Locked() || sem.Value() != 3 || bsem.Value() != 1 {
		t.Fatalf("after both ended: locked=%v sem=%d bsem=%d", l.Locked(), sem.Value(), bsem.Value())
	}
	if _, sessions := m.Snapshot(0); len(sessions) != 0 {
		t.Fatalf("sessions left: %+v", sessions)
	}
}

// TestSessionSharedByConnections: connections presenting the same key are
// one session, which ends with its last connection.
func TestSessionSharedByConnections(t *testing.T) {
	m := newManager(t, DefaultConfig())
	ctx := testCtx(t)
	key := []byte("0123456789abcdef")
	a, err := m.OpenSession(key, 10, "first")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.OpenSession(key, 10, "second")
	if a != b {
		t.Fatal("same key, different sessions")
	}
	c, _ := m.OpenSession(nil, 11, "")
	d, _ := m.OpenSession(nil, 11, "")
	if c == d || c == a {
		t.Fatal("keyless connections share a session")
	}
	l := create[*Lock](t, m, a, KindLock, "l", Params{})
	l.Acquire(ctx, a, 1, true, Forever)
	m.CloseSession(a)
	if !l.Locked() {
		t.Fatal("released while the session still has a connection")
	}
	m.CloseSession(b)
	if l.Locked() {
		t.Fatal("not released when the last connection closed")
	}
	// The key may be used again for a new session.
	e, _ := m.OpenSession(key, 12, "")
	if e == a || e.ID == a.ID {
		t.Fatal("an ended session was revived")
	}
	m.CloseSession(e)
	m.CloseSession(e) // a spurious extra close is harmless
	if _, n := m.Count(); n != 2 {
		t.Fatalf("%d sessions, want 2", n)
	}
}

func TestSessionEndHandsOnInOrder(t *testing.T) {
	m := newManager(t, DefaultConfig())
	ctx := testCtx(t)
	holder := newSession(t, m)
	l := create[*Lock](t, m, holder, KindLock, "l", Params{})
	l.Acquire(ctx, holder, 1, true, Forever)
	var sessions []*Session
	var chs []<-chan result[bool]
	for i := 0; i < 4; i++ {
		s := newSession(t, m)
		sessions = append(sessions, s)
		chs = append(chs, async(func() (bool, error) { return l.Acquire(ctx, s, 1, true, Forever) }))
		waitWaiters(t, l, i+1)
	}
	m.CloseSession(holder)
	for i, s := range sessions {
		if r := recv(t, chs[i]); !r.v {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		if i+1 < len(chs) {
			pending(t, chs[i+1], 5*time.Millisecond)
		}
		m.CloseSession(s) // dies holding it: the next one gets it
	}
	if l.Locked() {
		t.Fatal("still locked")
	}
}
