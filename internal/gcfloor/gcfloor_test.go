package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

func TestPercent(t *testing.T) {
	const M = 1 << 20
	for _, c := range []struct {
		live, scan, floor uint64
		base, want        int
	}{
		{0, 0, 32 * M, 100, 100},           // before the first collection: GOGC's
		{2 * M, 2 * M, 32 * M, 100, 850},   // a small heap: the runtime's minimum goal, scaled, reaches the floor first
		{8 * M, 8 * M, 32 * M, 100, 400},   // a larger one: live + scan × p reaches it first
		{8 * M, 16 * M, 32 * M, 100, 200},  // stacks and globals count in scan
		{32 * M, 32 * M, 32 * M, 100, 100}, // GOGC's goal reaches the floor
		{1024 * M, 1024 * M, 32 * M, 100, 100},
		{8 * M, 8 * M, 32 * M, 500, 500}, // GOGC=500 already reaches it
		{1, 1, 1 << 50, 100, maxPercent}, // bounded
	} {
		if got := Percent(c.live, c.scan, c.floor, c.base); got != c.want {
			t.Errorf("Percent(%d, %d, %d, %d) = %d, want %d", c.live, c.scan, c.floor, c.base, got, c.want)
		}
	}
}

func cycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

var sink []byte

// churn allocates n MiB of garbage, 1 MiB at a time (as the daemon does for
// large queue items), and returns the collections it cost.
func churn(n int) uint64 {
	before := cycles()
	for i := 0; i < n; i++ {
		sink = make([]byte, 1<<20)
		sink[0] = 1
	}
	sink = nil
	return cycles() - before
}

// With the floor, 64 MiB of 1 MiB garbage over a small live heap costs a
// few collections rather than one per few MiB; stop restores GOGC's
// percentage.
func TestFloorSpacesCollections(t *testing.T) {
	runtime.GC()
	without := churn(64)
	stop := Start(256 << 20)
	runtime.GC() // the first tune
	runtime.GC() // the finalizer of the first cycle's sentinel has run by the second
	with := churn(64)
	stop()
	if pct := debug.SetGCPercent(100); pct != 100 {
		t.Errorf("after stop the percentage is %d, want GOGC's 100", pct)
	}
	if with > 1 || without < 4 {
		t.Fatalf("64 MiB of garbage: %d collections with a 256 MiB floor, %d without (want at most 1 and at least 4)", with, without)
	}
	if Start(0)(); debug.SetGCPercent(100) != 100 {
		t.Error("a zero floor changed the percentage")
	}
}

func readUint(names ...string) []uint64 {
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	out := make([]uint64, len(names))
	for i := range s {
		out[i] = s[i].Value.Uint64()
	}
	return out
}

// The goal the runtime sets is the floor above the live heap, not more: the
// percentage applies to the stacks and globals too, and a percentage worked
// out from the live heap alone put the goal that much higher.
func TestGoalIsTheFloorAboveLive(t *testing.T) {
	const floor = 64 << 20
	stop := Start(floor)
	defer stop()
	runtime.GC()
	runtime.GC()
	v := readUint("/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes", "/gc/heap/goal:bytes")
	live, goal := v[0], v[3]
	if goal < live+floor*95/100 || goal > live+floor*105/100 {
		t.Fatalf("heap goal %d with %d live, %d of stacks and %d of globals scanned: want about %d (live + the %d floor)",
			goal, live, v[1], v[2], live+floor, floor)
	}
}
