package tests

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

// vmHWM returns the peak resident set of process pid in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// checkPeak fails when the daemon's peak RSS passed limit. The daemons of
// these tests are built without the race detector (startPlainDaemon),
// which multiplies memory use, so the bound is checked in every run.
func (d *daemon) checkPeak(t *testing.T, what string, limit int64) {
	t.Helper()
	if d.bin != plainBinPath {
		t.Fatalf("%s: checkPeak needs a daemon from startPlainDaemon", what)
	}
	peak := vmHWM(t, d.cmd.Process.Pid)
	t.Logf("%s: daemon VmHWM %d MiB", what, peak>>20)
	if peak > limit {
		t.Errorf("%s: daemon peak RSS %d MiB, over the bound of %d MiB", what, peak>>20, limit>>20)
	}
}

// smallItems returns a msgpack array of n bins of 5 bytes (the size of a
// small int's pickle), about 7n bytes.
func smallItems(n int, k int) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	_ = enc.EncodeArrayLen(n)
	item := []byte("\x80\x04K\x01.")
	for i := 0; i < n; i++ {
		if k > 1 {
			_ = enc.EncodeArrayLen(k)
		}
		for j := 0; j < k; j++ {
			if j == 0 && k > 1 {
				_ = enc.EncodeBytes([]byte(strconv.Itoa(i))) // distinct keys
				continue
			}
			_ = enc.EncodeBytes(item)
		}
	}
	return buf.Bytes()
}

// badTriples is n good [key, key_pickle, value] triples followed by one
// [key, value] pair: well-formed msgpack that dict.update must refuse.
func badTriples(n int) []byte {
	good := smallItems(n, 3)
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	_ = enc.EncodeArrayLen(n + 1)
	_, rest, _ := bytes.Cut(good, good[:5]) // array32 header of the good list
	buf.Write(rest)
	_ = enc.EncodeArrayLen(2)
	_ = enc.EncodeBytes([]byte("k"))
	_ = enc.EncodeBytes([]byte("v"))
	return buf.Bytes()
}

func lenOf(t *testing.T, d *daemon, kind, name string) int64 {
	t.Helper()
	c := d.dial(t)
	op := wire.OpLen
	if kind == wire.KindQueue {
		op = wire.OpQsize
	}
	n, ok := call(t, c, op, obj(kind, name)).(int64)
	if !ok {
		t.Fatalf("len of %s: not an int", name)
	}
	return n
}

// TestLimitListExtendSmallItems: a 57 MiB list.extend of 5-byte items
// (8.5 million of them) once kept 1.44 GB in the daemon. Over
// --max-object-bytes it is refused with limit before it is decoded, the
// list is unchanged, and the daemon's peak stays near the frame's size.
func TestLimitListExtendSmallItems(t *testing.T) {
	d := startPlainDaemon(t, "--max-object-bytes", "256000000")
	c := d.dial(t)
	call(t, c, wire.OpCreate, obj(wire.KindList, "l"))
	call(t, c, wire.OpAppend, obj(wire.KindList, "l", wire.ArgValue, []byte("x")))
	items := smallItems(57<<20/7, 1)
	err := callErr(c, wire.OpExtend, obj(wire.KindList, "l", wire.ArgItems, items))
	if code(err) != wire.CodeLimit {
		t.Fatalf("extend over the limit: %v, want limit", err)
	}
	if n := lenOf(t, d, wire.KindList, "l"); n != 1 {
		t.Fatalf("list has %d items after a refused extend, want 1", n)
	}
	// Within the limit, the same count of items is stored and costs what
	// the limit says, not 25 times the frame.
	items = smallItems(2_000_000, 1)
	call(t, c, wire.OpExtend, obj(wire.KindList, "l", wire.ArgItems, items))
	if n := lenOf(t, d, wire.KindList, "l"); n != 2_000_001 {
		t.Fatalf("list has %d items, want 2000001", n)
	}
	d.checkPeak(t, "list.extend", 500<<20)
}

// TestLimitDictUpdate: a 29 MiB dict.update once peaked at 1.45 GB even
// when refused. A malformed one and one over the byte limit are both
// refused with no effect, at a cost near the frame's size.
func TestLimitDictUpdate(t *testing.T) {
	d := startPlainDaemon(t, "--max-object-bytes", "100000000")
	c := d.dial(t)
	call(t, c, wire.OpCreate, obj(wire.KindDict, "d"))
	big := smallItems(29<<20/20, 3)
	err := callErr(c, wire.OpUpdate, obj(wire.KindDict, "d", wire.ArgItems, big))
	if code(err) != wire.CodeLimit {
		t.Fatalf("update over the limit: %v, want limit", err)
	}
	bad := badTriples(29 << 20 / 20)
	err = callErr(c, wire.OpUpdate, obj(wire.KindDict, "d", wire.ArgItems, bad))
	if code(err) != wire.CodeLimit && code(err) != wire.CodeBadRequest {
		t.Fatalf("malformed update: %v, want bad_request or limit", err)
	}
	if n := lenOf(t, d, wire.KindDict, "d"); n != 0 {
		t.Fatalf("dict has %d entries after refused updates, want 0", n)
	}
	ok := smallItems(500_000, 3)
	call(t, c, wire.OpUpdate, obj(wire.KindDict, "d", wire.ArgItems, ok))
	if n := lenOf(t, d, wire.KindDict, "d"); n != 500_000 {
		t.Fatalf("dict has %d entries, want 500000", n)
	}
	d.checkPeak(t, "dict.update", 400<<20)
}

// TestLimitParkedRequests: 100k pipelined blocking gets once cost 376 MB.
// Past --max-parked the rest are answered limit at once.
func TestLimitParkedRequests(t *testing.T) {
	const parked, total = 1000, 100_000
	d := startPlainDaemon(t, "--max-parked", strconv.Itoa(parked))
	c := d.dial(t)
	call(t, c, wire.OpCreate, obj(wire.KindQueue, "q"))
	r := d.raw(t)
	go func() {
		var buf bytes.Buffer
		for i := 1; i <= total; i++ {
			f, _ := wire.EncodeRequest(uint64(i), wire.OpGet, obj(wire.KindQueue, "q", wire.ArgTimeout, 30.0))
			buf.Write(f)
			if buf.Len() > 1<<20 || i == total {
				_ = r.nc.SetWriteDeadline(time.Now().Add(bound))
				if _, err := r.nc.Write(buf.Bytes()); err != nil {
					return
				}
				buf.Reset()
			}
		}
	}()
	limits := 0
	for limits < total-parked {
		rep := r.recv()
		if rep.Err == nil || rep.Err.Code != wire.CodeLimit {
			t.Fatalf("reply %d: %+v, want limit", rep.ID, rep.Err)
		}
		limits++
	}
	// The parked ones still work: a put is handed to the first of them.
	call(t, c, wire.OpPut, obj(wire.KindQueue, "q", wire.ArgItem, []byte("x")))
	rep := r.recv()
	if rep.Err != nil {
		t.Fatalf("a parked get: %v", rep.Err)
	}
	if n := lenOf(t, d, wire.KindQueue, "q"); n != 0 {
		t.Fatalf("queue has %d items, want 0", n)
	}
	d.checkPeak(t, "parked gets", 150<<20)
}

// TestLimitQueueBytes: a queue with maxsize=10 once held 609 MB, in the
// items of waiting putters. Those count against --max-object-bytes too:
// a put over it is refused at once and adds nothing. This is the exact
// count for a queue whose items the daemon keeps (no ring: --fastpath-dir
// none); TestLimitQueueBytesRing is the same with a ring.
func TestLimitQueueBytes(t *testing.T) {
	d := startPlainDaemon(t, "--max-object-bytes", "64000000", "--fastpath-dir", "none")
	c, r := floodQueue(t, d)
	// 10 items and fit-10 waiting putters fit in 64 MB; the others do not.
	fit := 64_000_000/(1<<20+manager.ItemOverhead) - 10
	for i := 0; i < floodPutters-fit; i++ {
		rep := r.recv()
		if rep.Err == nil || rep.Err.Code != wire.CodeLimit {
			t.Fatalf("reply %d: %+v, want limit", rep.ID, rep.Err)
		}
	}
	if n := lenOf(t, d, wire.KindQueue, "q"); n != 10 {
		t.Fatalf("queue has %d items, want 10", n)
	}
	// Draining the queue admits exactly the waiting putters.
	for i := 0; i < 10+fit; i++ {
		if _, err := c.Call(t.Context(), wire.OpGet, obj(wire.KindQueue, "q", wire.ArgTimeout, 5.0), nil); err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
	}
	for i := 0; i < fit; i++ {
		if rep := r.recv(); rep.Err != nil {
			t.Fatalf("waiting put %d: %v", rep.ID, rep.Err)
		}
	}
	if err := callErr(c, wire.OpGet, obj(wire.KindQueue, "q", wire.ArgBlock, false)); code(err) != wire.CodeEmpty {
		t.Fatalf("get after the drain: %v, want empty", err)
	}
	d.checkPeak(t, "queue putters", 300<<20)
}

// floodQueue fills a maxsize-10 queue "q" with 10 items of 1 MiB and sends
// floodPutters more puts of 1 MiB (timeout 30 s) on a raw connection,
// without reading the replies.
func floodQueue(t *testing.T, d *daemon) (*proxy.Client, *rawConn) {
	t.Helper()
	c := d.dial(t)
	call(t, c, wire.OpCreate, obj(wire.KindQueue, "q", wire.ArgMaxSize, int64(10)))
	item := bytes.Repeat([]byte{1}, 1<<20)
	for i := 0; i < 10; i++ {
		call(t, c, wire.OpPut, obj(wire.KindQueue, "q", wire.ArgItem, item))
	}
	r := d.raw(t)
	go func() {
		for i := 1; i <= floodPutters; i++ {
			f, _ := wire.EncodeRequest(uint64(i), wire.OpPut, obj(wire.KindQueue, "q", wire.ArgItem, item, wire.ArgTimeout, 30.0))
			_ = r.nc.SetWriteDeadline(time.Now().Add(bound))
			if _, err := r.nc.Write(f); err != nil {
				return
			}
		}
	}()
	return c, r
}

const floodPutters = 600

// TestLimitQueueBytesRing: the same flood on a queue with a ring. The ring
// counts its bytes as it holds them (with the span a wrapped ring skips),
// so the admitted putters are at most the daemon-kept queue's, not exactly
// as many: every put past the limit is refused at once, the queue keeps
// its maxsize, every admitted putter's item arrives, and the peak stays
// bounded.
func TestLimitQueueBytesRing(t *testing.T) {
	d := startPlainDaemon(t, "--max-object-bytes", "64000000")
	c, r := floodQueue(t, d)
	fit := 64_000_000/(1<<20+manager.ItemOverhead) - 10
	refused := 0
	for i := 0; i < floodPutters-fit; i++ { // at least these are refused at once
		if rep := r.recv(); rep.Err == nil || rep.Err.Code != wire.CodeLimit {
			t.Fatalf("reply %d: %+v, want limit", rep.ID, rep.Err)
		}
		refused++
	}
	if n := lenOf(t, d, wire.KindQueue, "q"); n != 10 {
		t.Fatalf("queue has %d items, want 10", n)
	}
	got := 0
	for {
		_, err := c.Call(t.Context(), wire.OpGet, obj(wire.KindQueue, "q", wire.ArgTimeout, 3.0), nil)
		if code(err) == wire.CodeEmpty {
			break
		}
		if err != nil {
			t.Fatalf("get %d: %v", got, err)
		}
		got++
	}
	admitted := 0
	for refused+admitted < floodPutters {
		rep := r.recv()
		switch {
		case rep.Err == nil:
			admitted++
		case rep.Err.Code == wire.CodeLimit:
			refused++
		default:
			t.Fatalf("reply %d: %+v", rep.ID, rep.Err)
		}
	}
	if admitted < 1 || admitted > fit || got != 10+admitted {
		t.Fatalf("%d putters admitted (at most %d), %d items got, want 10 + admitted", admitted, fit, got)
	}
	d.checkPeak(t, "queue putters, ring", 300<<20)
}

// TestLimitTotalBytes: --max-bytes is shared by every object; deleting an
// object gives its bytes back.
func TestLimitTotalBytes(t *testing.T) {
	d := startDaemon(t, "--max-bytes", "10000000")
	c := d.dial(t)
	big := bytes.Repeat([]byte{2}, 6_000_000)
	call(t, c, wire.OpCreate, obj(wire.KindList, "a"))
	call(t, c, wire.OpCreate, obj(wire.KindDict, "b"))
	call(t, c, wire.OpAppend, obj(wire.KindList, "a", wire.ArgValue, big))
	err := callErr(c, wire.OpSet, obj(wire.KindDict, "b", wire.ArgKey, []byte("k"), wire.ArgKeyP, []byte("k"), wire.ArgValue, big))
	if code(err) != wire.CodeLimit {
		t.Fatalf("set over the total: %v, want limit", err)
	}
	if n := lenOf(t, d, wire.KindDict, "b"); n != 0 {
		t.Fatalf("dict has %d entries after a refused set", n)
	}
	if _, err := c.Delete(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	call(t, c, wire.OpSet, obj(wire.KindDict, "b", wire.ArgKey, []byte("k"), wire.ArgKeyP, []byte("k"), wire.ArgValue, big))
}

// TestLimitReplacedValuesAreFreed: a dict key stored with a large value
// must not keep that value's request frame alive after the value is
// replaced (it is counted as the small new value). 40 keys set to 8 MiB and
// then to b"" would otherwise keep 320 MiB that no limit sees.
func TestLimitReplacedValuesAreFreed(t *testing.T) {
	d := startPlainDaemon(t)
	c := d.dial(t)
	call(t, c, wire.OpCreate, obj(wire.KindDict, "d"))
	big := bytes.Repeat([]byte{3}, 8<<20)
	for i := 0; i < 40; i++ {
		k := []byte(fmt.Sprintf("k%d", i))
		call(t, c, wire.OpSet, obj(wire.KindDict, "d", wire.ArgKey, k, wire.ArgKeyP, k, wire.ArgValue, big))
		call(t, c, wire.OpSet, obj(wire.KindDict, "d", wire.ArgKey, k, wire.ArgKeyP, k, wire.ArgValue, []byte{}))
	}
	call(t, c, wire.OpCreate, obj(wire.KindList, "l"))
	items := smallItems(1_000_000, 1) // 7 MB, of which one item stays each time
	for i := 0; i < 40; i++ {
		call(t, c, wire.OpExtend, obj(wire.KindList, "l", wire.ArgItems, items))
		call(t, c, wire.OpReplace, obj(wire.KindList, "l", wire.ArgItems, smallItems(i+1, 1)))
	}
	d.checkPeak(t, "replaced values", 320<<20)
}
