package proxy

import (
	"sync/atomic"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// How a Mutex handle of a Lock or RLock (or a Condition over one) takes and
// gives back its word on the fast path (see wordOps).

var lockOps = wordOps{
	acquire: func(f *fastWord, tid int64, d time.Duration, wt *statemem.Wait) statemem.Result {
		r := statemem.LockAcquireWait(f.w, f.aux, f.fp.slot, tid, d, wt)
		if r == statemem.OK {
			statemem.Stamp(f.since)
		}
		return r
	},
	release: func(f *fastWord, _ int64) statemem.Result { return statemem.LockRelease(f.w, f.aux) },
}

var rlockOps = wordOps{
	acquire: func(f *fastWord, tid int64, d time.Duration, wt *statemem.Wait) statemem.Result {
		r := statemem.RLockAcquireWait(f.w, f.aux, f.fp.slot, tid, d, wt)
		if r == statemem.OK && atomic.LoadUint64(f.w)>>statemem.DepthShift == 1 {
			statemem.Stamp(f.since) // the outermost acquire
		}
		return r
	},
	release: func(f *fastWord, tid int64) statemem.Result {
		return statemem.RLockRelease(f.w, f.aux, f.fp.slot, tid)
	},
}
