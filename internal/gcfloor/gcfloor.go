// Package gcfloor keeps the Go collector from running over and over while
// the live heap is small.
//
// The runtime starts a collection each time the heap grows by GOGC percent
// of what the last one left live. The daemon's live heap is small (a few
// MiB) while it moves large items through its queues: each 1 MiB item put
// and got over the socket is 1 MiB of garbage, so it collected every other
// item, and the scavenger handed the freed pages back to the kernel only to
// fault them in again for the next item (a third of a socket put+get of
// 1 MiB went there). A floor lets the heap grow by at least that many bytes
// before the next collection; above floor / (GOGC / 100) of live heap the
// percentage is GOGC's own. GOMEMLIMIT still bounds the heap.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// maxPercent bounds the percentage set for a very small live heap.
const maxPercent = 1_000_000

type tuner struct {
	floor   uint64
	base    int        // GOGC's percentage (the process's setting at Start)
	mu      sync.Mutex // stop against a tune running in the finalizer goroutine
	stopped bool
	sample  []metrics.Sample
}

// Start sets the collector's goal to at least floor bytes above the live
// heap, after every collection, until stop is called (which restores the
// GOGC percentage). It does nothing when floor is 0 or collection is off
// (GOGC=off).
func Start(floor uint64) (stop func()) {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if floor == 0 || base <= 0 {
		return func() {}
	}
	t := &tuner{floor: floor, base: base, sample: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
	t.arm()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if !t.stopped {
			t.stopped = true
			debug.SetGCPercent(base)
		}
	}
}

// heapMinimum is the runtime's smallest goal at GOGC=100 (4 MiB). The
// runtime scales it with the percentage: at 1,000 % no goal is below 40 MiB.
const heapMinimum = 4 << 20

// Percent is the smallest percentage, and at least base, whose goal is
// floor bytes above the live heap. The runtime's goal at percentage p is the
// larger of live + scan × p / 100 (scan: the live heap plus the stacks and
// globals it scanned) and heapMinimum × p / 100, so either term can be the
// one that reaches live + floor first. A percentage worked out from the
// live heap alone overshot by the second term: a daemon with 0.3 MiB live
// waited for 120 MiB of heap, not 32.
func Percent(live, scan, floor uint64, base int) int {
	if scan == 0 {
		return base
	}
	p := min(floor*100/scan, (live+floor)*100/heapMinimum, maxPercent)
	return max(base, int(p))
}

// sentinel is collected at every cycle: its finalizer tunes and re-arms.
// It is larger than the tiny allocator's 16 bytes, whose blocks a
// finalizer may never see freed.
type sentinel struct {
	t *tuner
	_ [24]byte
}

func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{t: t}, func(s *sentinel) {
		if s.t.tune() {
			s.t.arm()
		}
	})
}

// tune sets the percentage for what the last collection left live and
// scanned; it reports false once stopped.
func (t *tuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	metrics.Read(t.sample)
	var scan uint64
	for _, s := range t.sample {
		if s.Value.Kind() != metrics.KindUint64 {
			return true // a runtime without these metrics: leave GOGC's percentage
		}
		scan += s.Value.Uint64()
	}
	debug.SetGCPercent(Percent(t.sample[0].Value.Uint64(), scan, t.floor, t.base))
	return true
}
