package statemem

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

func newSeg(t *testing.T, capacity int) *Segment {
	t.Helper()
	s, err := Create(capacity)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openFD maps s the way a client maps the descriptor it received.
func openFD(t *testing.T, s *Segment) *Segment {
	t.Helper()
	c, err := OpenFD(s.FD(), s.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCreateOpenAndChecks(t *testing.T) {
	s := newSeg(t, 16)
	var st unix.Stat_t
	if err := unix.Fstat(s.FD(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o777 != 0o600 || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != 16*SlotSize || st.Uid != uint32(os.Geteuid()) {
		t.Fatalf("segment mode %#o size %d uid %d", st.Mode, st.Size, st.Uid)
	}
	c := openFD(t, s)
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
	if c.FD() != -1 {
		t.Fatal("a client's copy keeps a descriptor")
	}

	// Wrong size, a file others can read, an unsealed file, a bad header.
	if _, err := OpenFD(s.FD(), s.Size()+SlotSize); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("wrong size: %v", err)
	}
	loose, err := os.OpenFile(filepath.Join(t.TempDir(), "loose"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer loose.Close()
	if err := loose.Truncate(16 * SlotSize); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFD(int(loose.Fd()), 16*SlotSize); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("a file without seals: %v", err)
	}
	mfd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if err := unix.Ftruncate(mfd, 16*SlotSize); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFD(mfd, 16*SlotSize); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("a memfd others may map (mode 0777): %v", err)
	}
	if err := unix.Fchmod(mfd, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFD(mfd, 16*SlotSize); !errors.Is(err, ErrBadSegment) {
		t.Fatalf("zero header: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// Nobody can resize the segment: a process of the user that truncates or
// grows its descriptor gets EPERM, and the mapping stays whole.
func TestSegmentCannotBeResized(t *testing.T) {
	s := newSeg(t, 16)
	for _, n := range []int64{0, 8 * SlotSize, 32 * SlotSize} {
		if err := unix.Ftruncate(s.FD(), n); !errors.Is(err, unix.EPERM) {
			t.Fatalf("ftruncate to %d: %v, want EPERM", n, err)
		}
	}
	if err := unix.Fallocate(s.FD(), 0, 0, 64*SlotSize); !errors.Is(err, unix.EPERM) {
		t.Fatalf("fallocate past the end: %v, want EPERM", err)
	}
	if _, err := unix.FcntlInt(uintptr(s.FD()), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); !errors.Is(err, unix.EPERM) {
		t.Fatalf("adding a seal: %v, want EPERM", err)
	}
	r, _ := s.Alloc(KindLock, 0, 0)
	atomic.StoreUint64(s.State(r.Off), 1) // the mapping is still there
}

func TestCreateRefusesBadCapacity(t *testing.T) {
	for _, n := range []int{-1, 0, 1, 1<<24 + 1} {
		if _, err := Create(n); err == nil {
			t.Fatalf("capacity %d accepted", n)
		}
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

// The daemon frees and reuses slots by its own records: a ledger offset or
// tag rewritten in the segment moves nothing (issue: one 4-byte write to a
// Semaphore's ledger offset made the next Semaphore's ledger clear a live
// Lock, or the daemon panic).
func TestFreeTrustsOnlyItsOwnRecords(t *testing.T) {
	s := newSeg(t, 1+1+(1+LedgerSlots)) // a Lock and one Semaphore: reuse only
	lock, _ := s.Alloc(KindLock, 0, 0)
	sem, err := s.AllocSemaphore(KindSemaphore, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	LockAcquire(s.State(lock.Off), s.Aux(lock.Off), 9, 1, 0)
	held := atomic.LoadUint64(s.State(lock.Off))
	ledger := &s.LedgerEntries(sem.Off)[0]
	for _, bad := range []uint32{lock.Off, uint32(s.Size()) - SlotSize, uint32(s.Size()) - 4, 1 << 31} {
		atomic.StoreUint32((*uint32)(s.at(sem.Off, OffLedger)), bad)
		atomic.StoreUint32((*uint32)(s.at(sem.Off, OffLedgerLen)), 1<<30)
		if e := s.LedgerEntries(sem.Off); len(e) != LedgerLen || &e[0] != ledger {
			t.Fatalf("ledger offset %d written in the segment moved the daemon's ledger", bad)
		}
	}
	atomic.StoreUint32(s.Tag(sem.Off), uint32(KindLock)) // and a tag that reads Lock
	if got := s.Owned(0); len(got) != 0 {
		t.Fatalf("Owned lists a slot by its rewritten tag: %v", got)
	}
	s.Free(sem.Off)
	// The new Semaphore gets the freed run (the daemon's record), not the
	// Lock's slot nor the end of the segment.
	again, err := s.AllocSemaphore(KindSemaphore, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if e := s.LedgerEntries(again.Off); &e[0] != ledger {
		t.Fatal("the freed ledger run was not the one reused")
	}
	if got := atomic.LoadUint64(s.State(lock.Off)); got != held {
		t.Fatalf("the held Lock's word reads %#x, want %#x", got, held)
	}
	// A tag rewritten to Semaphore on a Lock's slot frees no run either.
	atomic.StoreUint32(s.Tag(lock.Off), uint32(KindSemaphore))
	atomic.StoreUint32((*uint32)(s.at(lock.Off, OffLedger)), again.Off+SlotSize)
	s.Free(lock.Off)
	if _, err := s.AllocSemaphore(KindSemaphore, 1, 0); err != ErrFull {
		t.Fatalf("a Lock's freed slot handed out a ledger run: %v", err)
	}
}
