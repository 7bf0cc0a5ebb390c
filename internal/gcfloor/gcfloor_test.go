package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		live, floor uint64
		base, want  int
	}{
		{0, 32 << 20, 100, 100},        // before the first collection: GOGC's
		{2 << 20, 32 << 20, 100, 1600}, // a small heap: the floor
		{32 << 20, 32 << 20, 100, 100}, // GOGC's goal reaches the floor
		{1 << 30, 32 << 20, 100, 100},  // a large heap: GOGC's
		{8 << 20, 32 << 20, 200, 400},  // GOGC=200 counts
		{16 << 20, 32 << 20, 200, 200}, // and reaches the floor sooner
		{1, 1 << 40, 100, maxPercent},  // bounded
	} {
		if got := Percent(c.live, c.floor, c.base); got != c.want {
			t.Errorf("Percent(%d, %d, %d) = %d, want %d", c.live, c.floor, c.base, got, c.want)
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
