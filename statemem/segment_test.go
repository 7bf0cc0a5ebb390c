package statemem

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

func newSeg(t *testing.T, capacity int) *Segment {
	t.Helper()
	s, err := Create(t.TempDir(), "state", capacity)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestCreateOpenAndChecks(t *testing.T) {
	s := newSeg(t, 16)
	fi, err := os.Lstat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || !fi.Mode().IsRegular() || fi.Size() != 16*SlotSize {
		t.Fatalf("segment file %v size %d", fi.Mode(), fi.Size())
	}
	c, err := Open(s.Path(), s.Size())
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Alloc(KindLock, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	atomic.StoreUint64(s.State(r.Off), 7)
	if got := atomic.LoadUint64(c.State(r.Off)); got != 7 {
		t.Fatalf("client sees %d, want 7", got)
	}
	if got := atomic.LoadUint32(c.Tag(r.Off)); got != r.Tag {
		t.Fatalf("client tag %x, want %x", got, r.Tag)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Path()); err != nil {
		t.Fatalf("a client's Close removed the file: %v", err)
	}

	// Wrong size, a symlink, a file others can read, another owner, a bad header.
	if _, err := Open(s.Path(), s.Size()+SlotSize); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("wrong size: %v", err)
	}
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(s.Path(), link); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(link, s.Size()); err == nil {
		t.Fatal("opened a segment through a symlink")
	}
	loose := filepath.Join(dir, "loose")
	if err := os.WriteFile(loose, make([]byte, 16*SlotSize), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(loose, 16*SlotSize); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("group-readable file: %v", err)
	}
	if err := os.Chmod(loose, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(loose, 16*SlotSize); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("zero header: %v", err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(loose, 4321, 4321); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(loose, 16*SlotSize); !errors.Is(err, ErrBadSegment) {
			t.Fatalf("another user's file: %v", err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Path()); !os.IsNotExist(err) {
		t.Fatalf("daemon's Close left the file: %v", err)
	}
}

func TestCreateRefusesBadCapacity(t *testing.T) {
	for _, n := range []int{-1, 0, 1, 1<<24 + 1} {
		if _, err := Create(t.TempDir(), "state", n); err == nil {
			t.Fatalf("capacity %d accepted", n)
		}
	}
	if _, err := Create(filepath.Join(t.TempDir(), "missing"), "state", 4); err == nil {
		t.Fatal("created in a missing directory")
	}
}

func TestAllocFreeReuse(t *testing.T) {
	s := newSeg(t, 4) // header + 3 objects
	var refs []Ref
	for i := 0; i < 3; i++ {
		r, err := s.Alloc(KindEvent, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.Kind() != KindEvent || !s.Valid(r.Off) {
			t.Fatalf("ref %+v", r)
		}
		refs = append(refs, r)
	}
	if _, err := s.Alloc(KindLock, 0, 0); !errors.Is(err, ErrFull) {
		t.Fatalf("full segment: %v", err)
	}
	atomic.StoreUint64(s.Aux(refs[1].Off), 99)
	s.Free(refs[1].Off)
	if atomic.LoadUint32(s.Tag(refs[1].Off)) != 0 || atomic.LoadUint64(s.State(refs[1].Off)) != BitDaemon {
		t.Fatal("a freed slot must read free and send clients to the daemon")
	}
	r, err := s.Alloc(KindLock, 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	if r.Off != refs[1].Off || r.Tag == refs[1].Tag || r.Kind() != KindLock {
		t.Fatalf("reuse: got %+v after freeing %+v", r, refs[1])
	}
	if atomic.LoadUint64(s.Aux(r.Off)) != 0 || atomic.LoadUint64(s.State(r.Off)) != 0 || atomic.LoadUint64(s.Bound(r.Off)) != 5 {
		t.Fatal("a reused slot must start clean")
	}
	for _, off := range []uint32{0, 1, SlotSize + 8, 4 * SlotSize} {
		if s.Valid(off) {
			t.Fatalf("offset %d accepted", off)
		}
	}
}

func TestOwned(t *testing.T) {
	s := newSeg(t, 8)
	a, _ := s.Alloc(KindLock, 0, 0)
	b, _ := s.Alloc(KindRLock, 0, 0)
	e, _ := s.Alloc(KindEvent, 0, 0)
	LockAcquire(s.State(a.Off), s.Aux(a.Off), 3, 1, 0)
	RLockAcquire(s.State(b.Off), s.Aux(b.Off), 3, 1, 0)
	atomic.StoreUint64(s.State(e.Off), 3) // an Event word that reads like slot 3: not a holder
	got := s.Owned(3)
	if len(got) != 2 || got[0] != a.Off || got[1] != b.Off {
		t.Fatalf("Owned(3) = %v, want [%d %d]", got, a.Off, b.Off)
	}
	if len(s.Owned(4)) != 0 {
		t.Fatal("slot 4 owns nothing")
	}
}

func TestCreateReplacesOnlyItsOwnStaleFile(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "state")
	if err := os.WriteFile(stale, []byte("left by a killed daemon"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Create(dir, "state", 4)
	if err != nil {
		t.Fatalf("stale file of this user: %v", err)
	}
	if s.Size() != 4*SlotSize {
		t.Fatal("size")
	}
	s.Close()
	if err := os.Symlink("/etc/passwd", stale); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(dir, "state", 4); err == nil {
		t.Fatal("replaced a symlink")
	}
	os.Remove(stale)
	if os.Geteuid() == 0 {
		if err := os.WriteFile(stale, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(stale, 4321, 4321); err != nil {
			t.Fatal(err)
		}
		if _, err := Create(dir, "state", 4); err == nil {
			t.Fatal("replaced another user's file")
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b"} {
		if _, err := Create(dir, bad, 4); err == nil {
			t.Fatalf("name %q accepted", bad)
		}
	}
}

// A Semaphore gets a zeroed ledger run beside its slot; a freed run is reused
// only for another Semaphore, and a retired one never.
func TestSemaphoreLedgers(t *testing.T) {
	s := newSeg(t, 1+2*(1+LedgerSlots))
	a, err := s.AllocSemaphore(KindSemaphore, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Ledger(a.Off, 0) == nil || s.Ledger(a.Off, LedgerLen-1) == nil || s.Ledger(a.Off, LedgerLen) != nil {
		t.Fatal("ledger entries out of place")
	}
	if *s.State(a.Off) != 3 || len(s.LedgerEntries(a.Off)) != LedgerLen {
		t.Fatalf("word %d", *s.State(a.Off))
	}
	*s.Ledger(a.Off, 5) = 2
	*s.State(a.Off) |= 7 << LatchShift
	if got := s.Owned(5); len(got) != 0 {
		t.Fatalf("Owned lists a Semaphore (the daemon visits those itself): %v", got)
	}
	if _, err := s.AllocSemaphore(KindBoundedSemaphore, 1, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AllocSemaphore(KindSemaphore, 1, 0); err != ErrFull {
		t.Fatalf("a full segment: %v", err)
	}
	s.Free(a.Off)
	if s.Ledger(a.Off, 0) != nil {
		t.Fatal("a freed semaphore keeps its ledger")
	}
	b, err := s.AllocSemaphore(KindSemaphore, 1, 0)
	if err != nil {
		t.Fatalf("the freed run is not reused: %v", err)
	}
	if e := s.Ledger(b.Off, 5); e == nil || *e != 0 {
		t.Fatal("a reused ledger is not zeroed")
	}
	s.Free(b.Off) // b's run is now free again; retire the other semaphore's instead
	c, _ := s.AllocSemaphore(KindSemaphore, 1, 0)
	s.Retire(c.Off)
	if _, err := s.AllocSemaphore(KindSemaphore, 1, 0); err != ErrFull {
		t.Fatalf("a retired run was handed out again: %v", err)
	}
}
