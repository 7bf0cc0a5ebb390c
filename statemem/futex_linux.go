package statemem

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MonoNow returns CLOCK_MONOTONIC in nanoseconds: the clock of every
// process on the host, so a stamp one process writes another can read.
func MonoNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}

// Stamp records in a since field that its lock was taken now.
func Stamp(since *uint64) { atomic.StoreUint64(since, MonoNow()) }

// SinceTime converts a since field's value to wall-clock time; ok is false
// for 0 (never stamped) or a stamp from the future (another boot). Stamps
// may come from CLOCK_MONOTONIC_COARSE (the C extension's), which lags this
// clock by at most a tick: a hold reads a few milliseconds longer at most.
func SinceTime(v uint64) (t time.Time, ok bool) {
	now := MonoNow()
	if v == 0 || v > now {
		return time.Time{}, false
	}
	return time.Now().Add(-time.Duration(now - v)), true
}

// Shared (not FUTEX_PRIVATE) futex ops: other processes map the words.
const (
	futexWait       = 0
	futexWake       = 1
	futexWaitBitset = 9
	futexWakeBitset = 10
)

// futexWaitWord sleeps while the low 32 bits of *w equal val, for at most
// d (d <= 0: until woken). It returns on a wake, a change of the word
// (EAGAIN), a signal or the timeout alike; callers re-read the word and
// recompute the time left.
func futexWaitWord(w *uint64, val uint32, d time.Duration) {
	var tsp unsafe.Pointer
	var ts unix.Timespec
	if d > 0 {
		ts = unix.NsecToTimespec(int64(d))
		tsp = unsafe.Pointer(&ts)
	}
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait, uintptr(val), uintptr(tsp), 0, 0)
}

// The wakes are raw system calls: FUTEX_WAKE never blocks, and the
// runtime's bookkeeping around an ordinary one (entersyscall, which wakes
// its monitor thread once that has gone to sleep) cost more than the call,
// at every ring op that changes what a sleeper waits for.

// WakeAll wakes every process asleep on the word at w.
func WakeAll(w *uint64) {
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, uintptr(1<<31-1), 0, 0, 0)
}

// WakeOne wakes one process asleep on the word at w (the kernel wakes them
// in arrival order): a Lock's release. It returns how many it woke (0 or
// 1; -1 on an error).
func WakeOne(w *uint64) int {
	n, _, errno := unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, 1, 0, 0, 0)
	if errno != 0 {
		return -1
	}
	return int(n)
}

// wakeBits wakes every sleeper on w whose wait bitset meets bits and
// returns how many it woke (-1 on an error).
func wakeBits(w *uint64, bits uint32) int {
	n, _, errno := unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeBitset, uintptr(1<<31-1), 0, 0, uintptr(bits))
	if errno != 0 {
		return -1
	}
	return int(n)
}

// futexWaitBits is futexWaitWord with a wake bitset and an absolute
// CLOCK_MONOTONIC deadline (mono, ns; 0: until woken). It reports false
// when the kernel never queued the caller (EAGAIN: the word no longer read
// val), which therefore took no wake-up.
func futexWaitBits(w *uint64, val uint32, mono uint64, bits uint32) bool {
	var tsp unsafe.Pointer
	var ts unix.Timespec
	if mono > 0 {
		ts = unix.NsecToTimespec(int64(mono))
		tsp = unsafe.Pointer(&ts)
	}
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitBitset, uintptr(val), uintptr(tsp), 0, uintptr(bits))
	return errno != unix.EAGAIN
}
