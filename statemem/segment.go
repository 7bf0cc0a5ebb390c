package statemem

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// littleEndian is checked once: the futex reads a word's first four bytes,
// which must be its low half.
var littleEndian = func() bool {
	x := uint64(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// Ref names an object slot: its byte offset in the segment and the tag the
// daemon wrote there (kind and generation), which a client checks before it
// trusts the offset.
type Ref struct {
	Off uint32
	Tag uint32
}

// Kind returns the kind code in r's tag.
func (r Ref) Kind() uint8 { return uint8(r.Tag) }

// Segment is a mapped state segment. The daemon creates it with Create and
// allocates object slots in it; a client maps it with OpenFD (the daemon
// passes the descriptor over the Unix socket) and only uses the words at the
// offsets the daemon gave it.
//
// The daemon's copy keeps, in Go memory, what it allocated where: the kind
// of object at each slot and the ledger run of each Semaphore. Freeing,
// reuse and the scans at session end read only those records, never the
// tags or ledger offsets in the segment, which any process of the user can
// overwrite.
type Segment struct {
	fd    int  // the memfd (daemon: kept to pass on; client: -1)
	owner bool // created here: Close closes the descriptor
	mem   []byte
	cap   uint32

	mu     sync.Mutex
	next   uint32   // lowest slot index never handed out
	free   []uint32 // freed slot indexes, reused oldest first
	runs   []uint32 // first indexes of freed ledger runs (LedgerSlots long)
	gen    []uint32 // per slot: generation of its last allocation
	kinds  []uint8  // per slot: the kind allocated there (KindLedger for a ledger run), KindFree when free
	ledger []uint32 // per slot of a Semaphore: the first slot index of its ledger run
}

// Seals is the set of seals Create puts on the segment and OpenFD demands:
// its size can never change, so no process can make another's mapping fault
// (SIGBUS) by truncating it, and the seals cannot be changed.
const Seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Create makes a segment of capacity object slots (the header included) in
// sealed anonymous memory (sealedMemory): clients get it only as a
// descriptor passed over the connection that answered them (SCM_RIGHTS, see
// FD).
func Create(capacity int) (*Segment, error) {
	if !littleEndian {
		return nil, ErrBigEndian
	}
	if capacity < 2 || capacity > maxCapacity {
		return nil, fmt.Errorf("statemem: capacity %d out of range [2, %d]", capacity, maxCapacity)
	}
	fd, mem, err := sealedMemory("state", int64(capacity)*SlotSize, true)
	if err != nil {
		return nil, err
	}
	s := &Segment{fd: fd, owner: true, mem: mem, cap: uint32(capacity), next: 1,
		gen: make([]uint32, capacity), kinds: make([]uint8, capacity), ledger: make([]uint32, capacity)}
	*(*uint32)(unsafe.Pointer(&mem[8])) = Version
	*(*uint32)(unsafe.Pointer(&mem[12])) = SlotSize
	*(*uint32)(unsafe.Pointer(&mem[16])) = uint32(capacity)
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[0])), Magic)
	return s, nil
}

// checkFD accepts only a regular file of this user, with no access for
// group or others, of the given size, sealed against resizing.
func checkFD(fd int, want int64) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("statemem: stat: %w", err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%w: not a regular file", ErrBadSegment)
	case st.Uid != uint32(os.Geteuid()):
		return fmt.Errorf("%w: owned by uid %d, not %d", ErrBadSegment, st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return fmt.Errorf("%w: mode %#o allows other users", ErrBadSegment, st.Mode&0o777)
	case st.Size != want:
		return fmt.Errorf("%w: size %d, want %d", ErrBadSegment, st.Size, want)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("%w: no seals: %v", ErrBadSegment, err)
	}
	if seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return fmt.Errorf("%w: not sealed against resizing (seals %#x)", ErrBadSegment, seals)
	}
	return nil
}

// OpenFD maps the segment behind fd, of size bytes, read-write, as a client
// does with the descriptor the daemon passed it. The file must be a regular
// file of this user, mode 0600 or stricter, of exactly that size, sealed
// against shrinking and growing, with a valid header. fd is not kept: the
// caller closes it.
func OpenFD(fd int, size int64) (*Segment, error) {
	if !littleEndian {
		return nil, ErrBigEndian
	}
	if size < 2*SlotSize || size%SlotSize != 0 || size > maxCapacity*SlotSize {
		return nil, fmt.Errorf("%w: size %d", ErrBadSegment, size)
	}
	if err := checkFD(fd, size); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("statemem: map segment: %w", err)
	}
	s := &Segment{fd: -1, mem: mem, cap: uint32(size / SlotSize)}
	if atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[0]))) != Magic ||
		*(*uint32)(unsafe.Pointer(&mem[8])) != Version ||
		*(*uint32)(unsafe.Pointer(&mem[12])) != SlotSize ||
		*(*uint32)(unsafe.Pointer(&mem[16])) != s.cap {
		unix.Munmap(mem)
		return nil, fmt.Errorf("%w: bad header", ErrBadSegment)
	}
	return s, nil
}

// FD returns the daemon's descriptor of the segment, to pass to a client
// over a Unix socket (-1 in a client's copy). It stays open until Close.
func (s *Segment) FD() int { return s.fd }

// Size returns the segment's size in bytes.
func (s *Segment) Size() int64 { return int64(len(s.mem)) }

// Capacity returns the number of object slots, the header included.
func (s *Segment) Capacity() int { return int(s.cap) }

// Alloc gives a new object of kind a zeroed slot, its state word set to
// state and its bound field to bound. Freed slots are reused oldest first,
// and only once no fresh slot is left, so that a client still holding a
// stale offset (of a deleted object) is unlikely to meet a new object there.
func (s *Segment) Alloc(kind uint8, state, bound uint64) (Ref, error) {
	s.mu.Lock()
	var i uint32
	switch {
	case s.next < s.cap:
		i = s.next
		s.next++
	case len(s.free) > 0:
		i = s.free[0]
		s.free = s.free[1:]
	default:
		s.mu.Unlock()
		return Ref{}, ErrFull
	}
	tag := s.tagLocked(i, kind)
	s.kinds[i] = kind
	s.ledger[i] = 0
	s.mu.Unlock()
	off := i * SlotSize
	atomic.StoreUint64(s.Aux(off), 0)
	atomic.StoreUint64(s.Bound(off), bound)
	atomic.StoreUint64(s.Since(off), 0)
	atomic.StoreUint64((*uint64)(s.at(off, OffLedger)), 0)
	atomic.StoreUint64((*uint64)(s.at(off, OffHeir)), 0) // the heir and the reserved word after it
	atomic.StoreUint64(s.State(off), state)
	atomic.StoreUint32(s.Tag(off), tag)
	return Ref{Off: off, Tag: tag}, nil
}

// tagLocked bumps slot i's generation and returns its tag for kind.
func (s *Segment) tagLocked(i uint32, kind uint8) uint32 {
	s.gen[i] = (s.gen[i] + 1) & (1<<24 - 1)
	if s.gen[i] == 0 {
		s.gen[i] = 1
	}
	return uint32(kind) | s.gen[i]<<8
}

// AllocSemaphore allocates a Semaphore's slot (kind KindSemaphore or
// KindBoundedSemaphore, free units in its word) and its ledger: a run of
// LedgerSlots zeroed slots, whose offset and length the object slot
// records. Ledger runs come from fresh slots or from freed ledgers only.
func (s *Segment) AllocSemaphore(kind uint8, free, bound uint64) (Ref, error) {
	s.mu.Lock()
	var first uint32
	switch {
	case s.next+LedgerSlots <= s.cap:
		first = s.next
		s.next += LedgerSlots
	case len(s.runs) > 0:
		first = s.runs[0]
		s.runs = s.runs[1:]
	default:
		s.mu.Unlock()
		return Ref{}, ErrFull
	}
	for i := first; i < first+LedgerSlots; i++ {
		// The entries cover the slots' tag fields: tags stay 0 (not an
		// object), and the generation moves on so that a stale offset of a
		// former object there never matches.
		s.tagLocked(i, KindLedger)
		s.kinds[i] = KindLedger
		clear(s.mem[i*SlotSize : (i+1)*SlotSize])
	}
	s.mu.Unlock()
	ref, err := s.Alloc(kind, free, bound)
	if err != nil {
		s.freeRun(first)
		return Ref{}, err
	}
	s.mu.Lock()
	s.ledger[ref.Off/SlotSize] = first
	s.mu.Unlock()
	atomic.StoreUint32((*uint32)(s.at(ref.Off, OffLedgerLen)), LedgerLen)
	atomic.StoreUint32((*uint32)(s.at(ref.Off, OffLedger)), first*SlotSize)
	return ref, nil
}

func (s *Segment) freeRun(first uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs = append(s.runs, first)
}

// LedgerEntries returns the whole ledger of the Semaphore at off (nil when
// it has none), for the daemon: where the daemon put it (its own record),
// whatever the ledger offset in the segment now reads.
func (s *Segment) LedgerEntries(off uint32) []uint32 {
	if !s.owner || !s.Valid(off) {
		return nil
	}
	s.mu.Lock()
	first := s.ledger[off/SlotSize]
	s.mu.Unlock()
	if first == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&s.mem[first*SlotSize])), LedgerLen)
}

// Ledger returns the ledger entry of session slot slot in the Semaphore at
// off, or nil when the object has no ledger or the slot id is too large: a
// client's view, read from the segment and bounds-checked (the daemon uses
// LedgerEntries).
func (s *Segment) Ledger(off, slot uint32) *uint32 {
	lo := atomic.LoadUint32((*uint32)(s.at(off, OffLedger)))
	n := atomic.LoadUint32((*uint32)(s.at(off, OffLedgerLen)))
	if lo == 0 || lo%SlotSize != 0 || slot >= n || uint64(lo)+uint64(n)*4 > uint64(len(s.mem)) {
		return nil
	}
	return (*uint32)(unsafe.Pointer(&s.mem[lo+4*slot])) //nolint:gosec // bounds checked above
}

// Free retires the object at off: its tag reads free and its state word
// carries BitDaemon, so a client with a stale offset goes to the daemon
// (which answers that the object is gone). Sleepers on the word are woken.
func (s *Segment) Free(off uint32) { s.release(off, true) }

// Retire is Free for an object whose slot (and ledger) a client may still
// write, its op having started before the object was removed: they are
// never handed out again.
func (s *Segment) Retire(off uint32) { s.release(off, false) }

func (s *Segment) release(off uint32, reuse bool) {
	i := off / SlotSize
	s.mu.Lock()
	k, first := s.kinds[i], s.ledger[i]
	s.kinds[i], s.ledger[i] = KindFree, 0
	if first != 0 {
		for j := first; j < first+LedgerSlots; j++ {
			s.kinds[j] = KindFree
		}
	}
	s.mu.Unlock()
	atomic.StoreUint32(s.Tag(off), 0)
	atomic.StoreUint64(s.State(off), BitDaemon)
	WakeAll(s.State(off))
	if k == KindSemaphore || k == KindBoundedSemaphore {
		atomic.StoreUint64((*uint64)(s.at(off, OffLedger)), 0)
		if reuse && first != 0 {
			s.freeRun(first)
		}
	}
	if reuse {
		s.mu.Lock()
		s.free = append(s.free, i)
		s.mu.Unlock()
	}
}

// Valid reports whether off is an object slot's offset in s.
func (s *Segment) Valid(off uint32) bool {
	return off >= SlotSize && off%SlotSize == 0 && off/SlotSize < s.cap
}

func (s *Segment) at(off uint32, field uint32) unsafe.Pointer {
	if !s.Valid(off) {
		panic(fmt.Sprintf("statemem: bad object offset %d", off))
	}
	return unsafe.Pointer(&s.mem[off+field])
}

// State returns the state word of the object at off.
func (s *Segment) State(off uint32) *uint64 { return (*uint64)(s.at(off, OffState)) }

// Aux returns the aux word (owner thread, value bits) of the object at off.
func (s *Segment) Aux(off uint32) *uint64 { return (*uint64)(s.at(off, OffAux)) }

// Tag returns the tag of the object at off.
func (s *Segment) Tag(off uint32) *uint32 { return (*uint32)(s.at(off, OffTag)) }

// Since returns the since field of the object at off: when its owner took
// it on the fast path (see Stamp).
func (s *Segment) Since(off uint32) *uint64 { return (*uint64)(s.at(off, OffSince)) }

// Bound returns the bound field of the object at off.
func (s *Segment) Bound(off uint32) *uint64 { return (*uint64)(s.at(off, OffBound)) }

// Owned returns the offsets of the Locks and RLocks whose words name slot
// as owner, for the daemon to release when that session ends. (Semaphores
// are visited one by one: see manager.releaseSlotWords.) Which slots hold
// Locks and RLocks comes from the daemon's records, not from the tags.
func (s *Segment) Owned(slot uint32) []uint32 {
	s.mu.Lock()
	var offs []uint32
	for i := uint32(1); i < s.next; i++ {
		if k := s.kinds[i]; k == KindLock || k == KindRLock {
			offs = append(offs, i*SlotSize)
		}
	}
	s.mu.Unlock()
	var out []uint32
	for _, off := range offs {
		if uint32(atomic.LoadUint64(s.State(off))&MaskLow) == slot {
			out = append(out, off)
		}
	}
	return out
}

// Close unmaps the segment and, in the daemon's copy, closes the
// descriptor (mappings in other processes stay valid until they unmap).
// A daemon that stops keeps its mapping until it exits instead: goroutines
// may still touch words.
func (s *Segment) Close() error {
	var err error
	if s.owner && s.fd >= 0 {
		if e := unix.Close(s.fd); e != nil {
			err = fmt.Errorf("statemem: close segment: %w", e)
		}
		s.fd = -1
	}
	if s.mem != nil {
		if e := unix.Munmap(s.mem); e != nil && err == nil {
			err = fmt.Errorf("statemem: unmap: %w", e)
		}
		s.mem = nil
	}
	return err
}
