package statemem

// Segment layout. Everything is native byte order; the futex word of an
// object is the low 32 bits of its state word, which on the little-endian
// hosts syncmgr supports (amd64, arm64) is the word's first four bytes.
//
//	offset 0     header (one object slot's worth, 64 bytes)
//	offset 64*i  object slot i, i = 1 .. Capacity-1
//
// Header:
//
//	0   u64  Magic
//	8   u32  Version
//	12  u32  SlotSize (64)
//	16  u32  Capacity (object slots including the header)
//	20  u32  reserved
//	24  u32  the waiter table's offset in bytes (0: none; waiters.go)
//	28  u32  the waiter table's number of entries
//	32  u32  waits asleep with no entry of the table (it was full)
//
// Object slot (64 bytes, one cache line, so that hot words of different
// objects never share a line):
//
//	0   u64  state word (futex word = bits 0-31)
//	8   u64  aux: owner thread id (Lock, RLock), value bits (Value)
//	16  u32  tag: kind (bits 0-7) | generation (bits 8-31); 0 = free slot
//	20  u32  reserved
//	24  u64  bound: a BoundedSemaphore's initial value; a Value's type class
//	32  u64  since: CLOCK_MONOTONIC nanoseconds at which a Lock's or RLock's
//	         owner took it by compare-and-swap (for status; 0 = unknown)
//	40  u32  ledger: a Semaphore's ledger offset in the segment (bytes)
//	44  u32  ledger length: entries in that ledger
//	48  u32  heir: the session slot a starving waiter reserved the next
//	         free turn for (Lock, RLock, Semaphore; 0 = none; waiters.go)
//	52..63   reserved, zero
//
// A Semaphore's ledger is a run of LedgerSlots object slots holding
// LedgerLen u32 entries (their tag fields are entries too: a scan of the
// segment may read a count there as a tag, so scans look objects up by
// offset in the daemon's own table before acting): entry i counts the units session slot i took by
// compare-and-swap and has not given back. Sessions with a slot id of
// LedgerLen or more take a Semaphore's units through the daemon.
const (
	Magic    uint64 = 0x5752474d434e5953 // "SYNCMGRW" read as a little-endian u64
	Version  uint32 = 2
	SlotSize        = 64

	OffState = 0
	OffAux   = 8
	OffTag   = 16
	OffBound = 24
	OffSince = 32
	// maxCapacity is the most object slots a segment has, the header
	// included (the C extension's MAX_SEGMENT is its size in bytes).
	maxCapacity = 1 << 24

	// OffLedger and OffLedgerLen: where a Semaphore's ledger is.
	OffLedger    = 40
	OffLedgerLen = 44

	// LedgerLen is the number of entries (session slots) in a Semaphore's
	// ledger, and LedgerSlots the object slots the ledger occupies.
	LedgerLen   = 128
	LedgerSlots = LedgerLen * 4 / SlotSize
)

// Bits of a state word. Bits 0-28 hold the owner's slot id (Lock, RLock),
// the free units (Semaphore) or the flag and generation (Event). Bits 29 and
// 30 are the same for every kind. Bit 31 is always 0. Bits 32-63 hold an
// RLock's recursion depth, and bits 32-60 a Semaphore's latch.
const (
	// MaskLow selects the owner slot / unit count / flag+generation.
	MaskLow uint64 = 1<<29 - 1
	// BitWaiters: clients may be asleep in FUTEX_WAIT on the word; whoever
	// frees the lock or sets the event must wake them (FUTEX_WAKE, all).
	BitWaiters uint64 = 1 << 29
	// BitDaemon: the daemon has waiters of its own queued on the object (or
	// keeps the object on the socket path for good). Clients must not take
	// or hand over the object by CAS while it is set: they send the op to
	// the daemon. Only the daemon sets and clears it.
	BitDaemon uint64 = 1 << 30

	// MaxSlot is the largest session slot id a word can hold; a session
	// with a larger slot id is refused the fast path.
	MaxSlot = uint32(MaskLow)

	// DepthShift and DepthOne place an RLock's depth in bits 32-63.
	DepthShift        = 32
	DepthOne   uint64 = 1 << DepthShift

	// EventFlag is an Event's flag; EventGenOne is one step of its
	// generation (bits 1-28), bumped by every set so that a waiter notices
	// a set followed at once by a clear.
	EventFlag   uint64 = 1
	EventGenOne uint64 = 2
	EventGenMax uint64 = MaskLow &^ EventFlag

	// LatchShift and MaskLatch place a Semaphore's latch in bits 32-60: the
	// slot id of the one op in flight on the semaphore (0: none). Units and
	// ledger entries change only while their changer holds the latch, so
	// that when a session dies holding it the daemon can recount what the
	// dead session held (see SemAcquire).
	LatchShift        = 32
	MaskLatch  uint64 = MaskLow << LatchShift
	// LatchDaemon is the latch value of the daemon's own ops (no session
	// has this slot id: Slots stops one short of it).
	LatchDaemon = MaxSlot
)

// Kind codes in an object slot's tag.
const (
	KindFree             uint8 = 0
	KindLock             uint8 = 1
	KindRLock            uint8 = 2
	KindSemaphore        uint8 = 3
	KindBoundedSemaphore uint8 = 4
	KindEvent            uint8 = 5
	KindValue            uint8 = 6
	KindLedger           uint8 = 7 // a slot of a Semaphore's ledger (generation only; never written as a tag)
)

// Value type classes, kept in a Value slot's bound field so that any client
// can apply a typecode's arithmetic: the low byte is the class, the next
// byte the width in bits.
const (
	ClassSigned   uint8 = 'i' // two's complement, wraps at the width
	ClassUnsigned uint8 = 'u' // wraps at the width
	ClassDouble   uint8 = 'd' // float64 bits
	ClassFloat    uint8 = 'f' // float64 bits of a value rounded to float32
	ClassBool     uint8 = '?' // 0 or 1
)
