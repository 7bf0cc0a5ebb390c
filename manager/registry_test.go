package manager

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestValidateName(t *testing.T) {
	good := []string{"a", "Z", "0", "lock-1", "a.b", "...", ".hidden", "x:y@z+w_v", "anon", "anon_x", "ANON-x", strings.Repeat("n", MaxNameLen)}
	for _, n := range good {
		if err := ValidateName(n); err != nil {
			t.Errorf("%q refused: %v", n, err)
		}
	}
	bad := []string{"", ".", "..", "/", "a/b", "../etc", "a\x00b", "\x00", "a b", "tab\t", "new\nline", "ü", "a\\b", "*",
		"anon-", "anon-lock-0123", strings.Repeat("n", MaxNameLen+1), strings.Repeat("x", 10<<10)}
	for _, n := range bad {
		if err := ValidateName(n); !isErr(err, ErrBadName) {
			t.Errorf("%.40q accepted: %v", n, err)
		}
	}
}

func TestRegistry(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s := newSession(t, m)

	t.Run("get or create", func(t *testing.T) {
		a, created, err := m.Create(s, KindSemaphore, "sem", Params{Value: 3})
		if err != nil || !created {
			t.Fatalf("%v %v", created, err)
		}
		b, created, err := m.Create(s, KindSemaphore, "sem", Params{Value: 99}) // parameters not compared
		if err != nil || created || a != b || b.(*Semaphore).Value() != 3 {
			t.Fatalf("second create: %v %v same=%v", created, err, a == b)
		}
		if o, err := m.Lookup(KindSemaphore, "sem"); err != nil || o != a {
			t.Fatalf("lookup: %v", err)
		}
	})

	t.Run("kind mismatch", func(t *testing.T) {
		m.Create(s, KindLock, "k", Params{})
		if _, _, err := m.Create(s, KindRLock, "k", Params{}); !isErr(err, ErrKindMismatch) {
			t.Fatalf("create: %v", err)
		}
		if _, err := m.Lookup(KindQueue, "k"); !isErr(err, ErrKindMismatch) {
			t.Fatalf("lookup: %v", err)
		}
		if _, err := m.Lookup(KindLock, "missing"); !isErr(err, ErrNoSuchObject) {
			t.Fatalf("lookup missing: %v", err)
		}
		if _, _, err := m.Create(s, "widget", "w", Params{}); !isErr(err, ErrUnknownKind) {
			t.Fatalf("unknown kind: %v", err)
		}
	})

	t.Run("bad names", func(t *testing.T) {
		for _, n := range []string{"/", "a/b", "..", ".", "a\x00", strings.Repeat("x", 10<<10), "anon-lock-00000000000000000000000000000000"} {
			if _, _, err := m.Create(s, KindLock, n, Params{}); !isErr(err, ErrBadName) {
				t.Errorf("%.30q: %v", n, err)
			}
		}
	})

	t.Run("delete", func(t *testing.T) {
		m.Create(s, KindEvent, "del", Params{})
		if !m.Delete("del") {
			t.Fatal("delete reported false")
		}
		if m.Delete("del") {
			t.Fatal("second delete reported true")
		}
		if _, err := m.Lookup(KindEvent, "del"); !isErr(err, ErrNoSuchObject) {
			t.Fatalf("lookup after delete: %v", err)
		}
		if _, created, _ := m.Create(s, KindQueue, "del", Params{}); !created {
			t.Fatal("the name is not free after delete")
		}
	})

	t.Run("snapshot", func(t *testing.T) {
		objs, sessions := m.Snapshot(0)
		for i := 1; i < len(objs); i++ {
			if objs[i-1].Name >= objs[i].Name {
				t.Fatalf("not sorted: %q %q", objs[i-1].Name, objs[i].Name)
			}
		}
		if len(sessions) != 1 || sessions[0].ID != s.ID || sessions[0].Label != "test" || sessions[0].Conns != 1 {
			t.Fatalf("sessions %+v", sessions)
		}
		if objs, _ := m.Snapshot(2); len(objs) != 2 {
			t.Fatalf("limit: %d objects", len(objs))
		}
	})
}

func TestAnonymousObjects(t *testing.T) {
	m := newManager(t, DefaultConfig())
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)

	obj, created, err := m.Create(a, KindLock, "", Params{})
	if err != nil || !created {
		t.Fatal(err)
	}
	name := obj.Name()
	if !regexp.MustCompile(`^anon-lock-[0-9a-f]{32}$`).MatchString(name) {
		t.Fatalf("generated name %q", name)
	}
	other, _, _ := m.Create(a, KindLock, "", Params{})
	if other.Name() == name {
		t.Fatal("two anonymous objects share a name")
	}
	objs, _ := m.Snapshot(0)
	if len(objs) != 2 || !objs[0].Anonymous || objs[0].Refs != 1 {
		t.Fatalf("snapshot %+v", objs)
	}

	// b takes a reference; a's last reference goes; b's keeps it alive.
	if err := m.Incref(b, name); err != nil {
		t.Fatal(err)
	}
	if err := m.Decref(a, name); err != nil {
		t.Fatal(err)
	}
	if err := m.Decref(a, name); err != nil { // a holds none: no-op
		t.Fatal(err)
	}
	if _, err := m.Lookup(KindLock, name); err != nil {
		t.Fatalf("deleted while b references it: %v", err)
	}
	// A waiter on it fails with ErrDeleted when the last reference goes.
	l := obj.(*Lock)
	l.Acquire(ctx, a, 1, true, Forever)
	ch := async(func() (bool, error) { return l.Acquire(ctx, b, 1, true, Forever) })
	waitWaiters(t, l, 1)
	if err := m.Decref(b, name); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, ch); r.v || !isErr(r.err, ErrDeleted) {
		t.Fatalf("waiter: %v %v", r.v, r.err)
	}
	if _, err := m.Lookup(KindLock, name); !isErr(err, ErrNoSuchObject) {
		t.Fatalf("lookup after the last decref: %v", err)
	}
	if err := m.Incref(a, name); !isErr(err, ErrNoSuchObject) {
		t.Fatalf("incref of a deleted object: %v", err)
	}

	// Session end drops its references.
	o2, _, _ := m.Create(b, KindQueue, "", Params{})
	m.Incref(b, o2.Name())
	m.CloseSession(b)
	if _, err := m.Lookup(KindQueue, o2.Name()); !isErr(err, ErrNoSuchObject) {
		t.Fatalf("anonymous object outlived its only session: %v", err)
	}

	// Refcount ops on named objects are no-ops.
	m.Create(a, KindEvent, "named", Params{})
	m.Decref(a, "named")
	m.Decref(a, "named")
	if _, err := m.Lookup(KindEvent, "named"); err != nil {
		t.Fatalf("decref deleted a named object: %v", err)
	}
	if err := m.Share("missing"); !isErr(err, ErrNoSuchObject) {
		t.Fatalf("share of a missing object: %v", err)
	}
}

func TestShareGrace(t *testing.T) {
	const grace = 150 * time.Millisecond
	cfg := DefaultConfig()
	cfg.ShareGrace = grace
	m := newManager(t, cfg)
	a, b := newSession(t, m), newSession(t, m)
	exists := func(name string) bool {
		_, err := m.Lookup(KindValue, name)
		return err == nil
	}
	waitGone := func(name string) time.Duration {
		start := time.Now()
		for exists(name) {
			if time.Since(start) > bound {
				t.Fatalf("%s never collected", name)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}

	// Shared, then the last reference goes: it lingers for the grace.
	o, _, _ := m.Create(a, KindValue, "", Params{Typecode: "i"})
	m.Share(o.Name())
	start := time.Now()
	m.Decref(a, o.Name())
	if !exists(o.Name()) {
		t.Fatal("shared object deleted at once")
	}
	waitGone(o.Name())
	if el := time.Since(start); el < grace {
		t.Fatalf("collected after %v, grace is %v", el, grace)
	}

	// A reference taken during the grace keeps it.
	o, _, _ = m.Create(a, KindValue, "", Params{Typecode: "i"})
	m.Share(o.Name())
	m.Decref(a, o.Name())
	time.Sleep(grace / 3)
	m.Incref(b, o.Name())
	time.Sleep(grace * 2)
	if !exists(o.Name()) {
		t.Fatal("collected although b took a reference during the grace")
	}
	m.Decref(b, o.Name()) // shared still: a new grace starts
	if !exists(o.Name()) {
		t.Fatal("deleted at once after the second last reference")
	}
	waitGone(o.Name())

	// Not shared: deleted at once.
	o, _, _ = m.Create(a, KindValue, "", Params{Typecode: "i"})
	m.Decref(a, o.Name())
	if exists(o.Name()) {
		t.Fatal("unshared object lingered")
	}
}

// TestShareGraceStaleTimer: a grace timer that fired while a reference was
// being taken and dropped again must not delete the object before the new
// grace has run.
func TestShareGraceStaleTimer(t *testing.T) {
	const grace = 30 * time.Millisecond
	cfg := DefaultConfig()
	cfg.ShareGrace = time.Hour
	m := newManager(t, cfg)
	a := newSession(t, m)
	o, _, _ := m.Create(a, KindValue, "", Params{Typecode: "i"})
	name := o.Name()
	m.Share(name)
	m.cfg.ShareGrace = grace
	m.Decref(a, name) // the first grace timer starts

	// Hold the registry while the first timer fires, so that its callback
	// waits for the lock; meanwhile a reference comes and goes, which starts
	// a second grace period.
	m.mu.Lock()
	time.Sleep(3 * grace)
	e := m.objects[name]
	e.refs++
	a.refs[name]++
	e.grace.Stop()
	e.grace = nil
	m.cfg.ShareGrace = time.Hour
	a.refs[name]--
	e.refs--
	if dead := m.maybeCollectLocked(name, e); dead != nil {
		t.Fatal("collected without a grace")
	}
	m.mu.Unlock()

	time.Sleep(3 * grace) // the stale callback has run by now
	if _, err := m.Lookup(KindValue, name); err != nil {
		t.Fatalf("deleted by the stale grace timer: %v", err)
	}
	m.Delete(name) // stops the second timer
}

func TestObjectLimits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxObjectsPerSession = 3
	cfg.MaxObjects = 5
	m := newManager(t, cfg)
	a, b := newSession(t, m), newSession(t, m)
	for _, n := range []string{"a1", "a2", ""} {
		if _, _, err := m.Create(a, KindEvent, n, Params{}); err != nil {
			t.Fatalf("create %q: %v", n, err)
		}
	}
	if _, _, err := m.Create(a, KindEvent, "a4", Params{}); !isErr(err, ErrLimit) {
		t.Fatalf("fourth object of a session: %v", err)
	}
	if _, _, err := m.Create(a, KindEvent, "", Params{}); !isErr(err, ErrLimit) {
		t.Fatalf("fourth (anonymous) object of a session: %v", err)
	}
	if _, created, err := m.Create(a, KindEvent, "a1", Params{}); err != nil || created {
		t.Fatalf("get of an existing object counts against the cap: %v", err)
	}
	m.Delete("a2")
	if _, _, err := m.Create(a, KindEvent, "a2-again", Params{}); err != nil {
		t.Fatalf("create after a delete: %v", err)
	}
	if _, _, err := m.Create(b, KindEvent, "b1", Params{}); err != nil {
		t.Fatalf("another session: %v", err)
	}
	if _, _, err := m.Create(b, KindEvent, "b2", Params{}); err != nil {
		t.Fatalf("another session: %v", err)
	}
	if _, _, err := m.Create(b, KindEvent, "b3", Params{}); !isErr(err, ErrLimit) {
		t.Fatalf("over the global cap: %v", err)
	}
	if n, _ := m.Count(); n != 5 {
		t.Fatalf("%d objects", n)
	}
	// Named objects outlive their creator, but stop counting against it.
	m.CloseSession(a)
	c := newSession(t, m)
	m.Delete("b1")
	if _, _, err := m.Create(c, KindEvent, "c1", Params{}); err != nil {
		t.Fatalf("create after room was made: %v", err)
	}
}

func TestDeleteFailsWaiters(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s, s2 := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	l := create[*Lock](t, m, s, KindLock, "l", Params{})
	q := create[*Queue](t, m, s, KindQueue, "q", Params{MaxSize: 1})
	e := create[*Event](t, m, s, KindEvent, "e", Params{})
	sem := create[*Semaphore](t, m, s, KindSemaphore, "sem", Params{Value: 0})
	l.Acquire(ctx, s, 1, true, Forever)
	lw := async(func() (bool, error) { return l.Acquire(ctx, s2, 1, true, Forever) })
	gw := async(func() ([]byte, error) {
		q2 := create[*Queue](t, m, s, KindQueue, "q-empty", Params{})
		return q2.Get(ctx, true, Forever)
	})
	q.Put(ctx, item(0), true, Forever)
	pw := async(func() (struct{}, error) { return struct{}{}, q.Put(ctx, item(1), true, Forever) })
	ew := async(func() (bool, error) { return e.Wait(ctx, Forever) })
	sw := async(func() (bool, error) { return sem.Acquire(ctx, s2, 1, true, Forever) })
	waitWaiters(t, l, 1)
	waitWaiters(t, q, 1)
	waitWaiters(t, e, 1)
	waitWaiters(t, sem, 1)
	qe, _ := m.Lookup(KindQueue, "q-empty")
	waitWaiters(t, qe, 1)
	for _, n := range []string{"l", "q", "e", "sem", "q-empty"} {
		if !m.Delete(n) {
			t.Fatalf("delete %s", n)
		}
	}
	if r := recv(t, lw); !isErr(r.err, ErrDeleted) {
		t.Fatalf("lock waiter: %v", r.err)
	}
	if r := recv(t, gw); !isErr(r.err, ErrDeleted) {
		t.Fatalf("getter: %v", r.err)
	}
	if r := recv(t, pw); !isErr(r.err, ErrDeleted) {
		t.Fatalf("putter: %v", r.err)
	}
	if r := recv(t, ew); !isErr(r.err, ErrDeleted) {
		t.Fatalf("event waiter: %v", r.err)
	}
	if r := recv(t, sw); !isErr(r.err, ErrDeleted) {
		t.Fatalf("semaphore waiter: %v", r.err)
	}
	// Blocking calls on a deleted object (through a stale handle) fail too.
	if _, err := l.Acquire(ctx, s2, 1, true, Forever); !isErr(err, ErrDeleted) {
		t.Fatalf("acquire on a deleted lock: %v", err)
	}
	if _, err := q.Get(ctx, true, Forever); !isErr(err, ErrDeleted) {
		t.Fatalf("get on a deleted queue: %v", err)
	}
}

func TestCloseFailsWaiters(t *testing.T) {
	m := New(DefaultConfig())
	s, s2 := newSession(t, m), newSession(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	l := create[*Lock](t, m, s, KindLock, "l", Params{})
	q := create[*Queue](t, m, s, KindQueue, "q", Params{})
	e := create[*Event](t, m, s, KindEvent, "e", Params{})
	l.Acquire(ctx, s, 1, true, Forever)
	lw := async(func() (bool, error) { return l.Acquire(ctx, s2, 1, true, Forever) })
	gw := async(func() ([]byte, error) { return q.Get(ctx, true, Forever) })
	ew := async(func() (bool, error) { return e.Wait(ctx, Forever) })
	waitWaiters(t, l, 1)
	waitWaiters(t, q, 1)
	waitWaiters(t, e, 1)
	m.Close()
	if r := recv(t, lw); !isErr(r.err, ErrShutdown) {
		t.Fatalf("lock waiter: %v", r.err)
	}
	if r := recv(t, gw); !isErr(r.err, ErrShutdown) {
		t.Fatalf("getter: %v", r.err)
	}
	if r := recv(t, ew); !isErr(r.err, ErrShutdown) {
		t.Fatalf("event waiter: %v", r.err)
	}
	if _, _, err := m.Create(s, KindLock, "new", Params{}); !isErr(err, ErrShutdown) {
		t.Fatalf("create after close: %v", err)
	}
	if _, err := m.OpenSession(nil, 1, ""); !isErr(err, ErrShutdown) {
		t.Fatalf("open session after close: %v", err)
	}
	if err := q.Put(ctx, item(0), true, Forever); !isErr(err, ErrShutdown) {
		t.Fatalf("put after close: %v", err)
	}
	m.CloseSession(s) // sessions still end cleanly
	m.CloseSession(s2)
}
