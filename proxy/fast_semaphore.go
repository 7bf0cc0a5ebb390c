package proxy

import (
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// How a Mutex handle of a Semaphore or BoundedSemaphore takes and gives
// back a unit on the fast path (see wordOps): under the latch, with this
// session's ledger entry.

var semaphoreOps = wordOps{
	ledger: true,
	acquire: func(f *fastWord, _ int64, d time.Duration, wt *statemem.Wait) statemem.Result {
		return statemem.SemAcquireWait(f.w, f.taken, f.fp.slot, d, wt)
	},
	release: func(f *fastWord, _ int64) statemem.Result { return statemem.SemRelease(f.w, f.taken, f.fp.slot) },
}
