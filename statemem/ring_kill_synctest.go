//go:build synctest

package statemem

import (
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// The kill hook of ClientRing ops, in test builds only (go test -tags
// synctest; ring_kill.go is the no-op of every other build).

// ringKillStep: the process kills itself at this labelled step of a ring
// op (0: never), as the Python extension's _set_queue_kill_step does,
// with the same labels: put 1 latch taken, 2 record written, 3 committed;
// get 11 latch taken, 12 item copied and taken by the caller, 13 committed
// (on a JoinableQueue: its debt not yet recorded); 21 leaving a sleep;
// task_done 31 latch taken, 32 journal written, 33 committed (its debt not
// yet paid).
var ringKillStep atomic.Int32

// SetRingKillStep arms the kill hook (0 disarms it).
func SetRingKillStep(n int) { ringKillStep.Store(int32(n)) }

func step(n int32) {
	if ringKillStep.Load() == n {
		_ = unix.Kill(os.Getpid(), unix.SIGKILL)
		select {} // the signal is on its way
	}
}
