package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

// The fast path's segment is writable by every process of the user that
// asks for it. These tests are such a process, buggy or hostile: they map
// the segment as any client does and rewrite words, latches, ledger
// entries and ledger offsets, and try to resize it. The daemon must keep
// serving, and every object the writes did not touch must keep its state.

// scribbler is a session of its own that attached to the fast path and
// mapped the segment the daemon passed it.
type scribbler struct {
	raw  *rawConn
	seg  *statemem.Segment
	fd   int
	slot uint32
}

// scribble attaches a raw session to d's fast path and maps the segment
// that comes with the reply.
func scribble(t *testing.T, d *daemon) *scribbler {
	t.Helper()
	r := d.raw(t)
	r.send(1, wire.OpFastpathAttach, map[string]any{})
	uc := r.nc.(*net.UnixConn)
	_ = uc.SetReadDeadline(time.Now().Add(bound))
	hdr := make([]byte, wire.HeaderSize)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := uc.ReadMsgUnix(hdr, oob)
	if err != nil {
		t.Fatalf("read the attach reply: %v", err)
	}
	if _, err := io.ReadFull(uc, hdr[n:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[0])<<24|int(hdr[1])<<16|int(hdr[2])<<8|int(hdr[3]))
	if _, err := io.ReadFull(uc, body); err != nil {
		t.Fatal(err)
	}
	rep, err := wire.DecodeReply(body)
	if err != nil || rep.Err != nil {
		t.Fatalf("attach: %v %v", err, rep.Err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("no descriptor with the attach reply: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("descriptors %v: %v", fds, err)
	}
	t.Cleanup(func() { unix.Close(fds[0]) })
	m := rep.Result.(map[string]any)
	size, slot := toInt64(t, m["size"]), toInt64(t, m["slot"])
	seg, err := statemem.OpenFD(fds[0], size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	return &scribbler{raw: r, seg: seg, fd: fds[0], slot: uint32(slot)}
}

func toInt64(t *testing.T, v any) int64 {
	t.Helper()
	switch x := v.(type) {
	case int64:
		return x
	case uint64:
		return int64(x)
	case int8:
		return int64(x)
	case uint8:
		return int64(x)
	case int16:
		return int64(x)
	case uint16:
		return int64(x)
	case int32:
		return int64(x)
	case uint32:
		return int64(x)
	}
	t.Fatalf("not an integer: %T %v", v, v)
	return 0
}

// offOf asks the daemon where an object's words are.
func offOf(t *testing.T, c *proxy.Client, kind, name string) uint32 {
	t.Helper()
	m := call(t, c, wire.OpFastpathRef, obj(kind, name)).(map[string]any)
	return uint32(toInt64(t, m["off"]))
}

// u32 and u64 are fields of the segment at byte offset off.
func (s *scribbler) u32(off uint32) *uint32 {
	return (*uint32)(unsafe.Add(unsafe.Pointer(s.seg.State(statemem.SlotSize)), int(off)-statemem.SlotSize))
}

func (s *scribbler) u64(off uint32) *uint64 { return (*uint64)(unsafe.Pointer(s.u32(off))) }

// alive checks that the daemon answers and its log shows no panic.
func alive(t *testing.T, d *daemon, c *proxy.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if _, err := c.Call(ctx, wire.OpStatus, map[string]any{}, nil); err != nil {
		t.Fatalf("status: %v\n%s", err, d.stderr)
	}
	if strings.Contains(d.stderr.String(), "panic") {
		t.Fatalf("the daemon panicked:\n%s", d.stderr)
	}
}

// Issue 22, finding 1: one 4-byte write to a Semaphore's ledger offset, the
// Semaphore deleted, a new one created in the freed space. The daemon frees
// and reuses by its own records: the held Lock the offset pointed at stays
// held, and an offset past the end does not crash it.
func TestScribbledLedgerOffsetMovesNothing(t *testing.T) {
	for _, target := range []string{"a live Lock", "the segment's end"} {
		t.Run(target, func(t *testing.T) {
			d := startDaemon(t, "--fastpath-objects", "40")
			a := d.dial(t, proxy.WithFastPath())
			b := d.dial(t, proxy.WithFastPath())
			if ok, why := a.FastPath(); !ok {
				t.Fatalf("no fast path: %s", why)
			}
			ctx := context.Background()
			held, err := a.Lock(ctx, "held")
			must(t, err)
			must(t, held.Acquire(ctx))
			// Four Semaphores (a ledger run and a slot each) fill the 40
			// slots but three: the next one must reuse a freed run.
			for i := 0; i < 4; i++ {
				if _, err := a.Semaphore(ctx, fmt.Sprint("s", i), 2); err != nil {
					t.Fatal(err)
				}
			}
			s := scribble(t, d)
			bad := offOf(t, a, "lock", "held")
			if target == "the segment's end" {
				bad = 40 * statemem.SlotSize
			}
			atomic.StoreUint32(s.u32(offOf(t, a, "semaphore", "s0")+statemem.OffLedger), bad)
			if ok, err := a.Delete(ctx, "s0"); err != nil || !ok {
				t.Fatalf("delete: %v %v", ok, err)
			}
			fresh, err := a.Semaphore(ctx, "fresh", 3)
			must(t, err)
			alive(t, d, b)
			lb, err := b.Lock(ctx, "held")
			must(t, err)
			if ok, err := lb.TryAcquire(ctx); ok || err != nil {
				t.Fatalf("another client took the held Lock: %v %v", ok, err)
			}
			for i := 0; i < 3; i++ {
				if ok, err := fresh.TryAcquire(ctx); !ok || err != nil {
					t.Fatalf("the new Semaphore's unit %d: %v %v", i, ok, err)
				}
			}
			if ok, _ := fresh.TryAcquire(ctx); ok {
				t.Fatal("the new Semaphore has a fourth unit")
			}
			must(t, held.Release(ctx))
		})
	}
}

// Words, latches and ledger entries rewritten, and a resize tried: each bad
// word breaks at most its own object, for as long as the daemon takes to
// notice, and never the daemon nor any other object.
func TestScribbledWordsBreakOnlyTheirObject(t *testing.T) {
	d := startDaemon(t)
	a := d.dial(t, proxy.WithFastPath())
	b := d.dial(t, proxy.WithFastPath())
	ctx := context.Background()
	held, err := a.Lock(ctx, "held")
	must(t, err)
	must(t, held.Acquire(ctx))
	keep, err := a.Semaphore(ctx, "keep", 5)
	must(t, err)
	for i := 0; i < 2; i++ {
		must(t, keep.Acquire(ctx))
	}
	for _, name := range []string{"stray-latch", "daemon-latch", "huge-entry"} {
		if _, err := a.Semaphore(ctx, name, 3); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"stray-lock", "bit-lock"} {
		if _, err := a.Lock(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.RLock(ctx, "stray-rlock"); err != nil {
		t.Fatal(err)
	}
	s := scribble(t, d)

	// A resize is refused, and the daemon (which would die of SIGBUS on a
	// shrunk file) keeps serving.
	for _, n := range []int64{0, statemem.SlotSize, s.seg.Size() * 2} {
		if err := unix.Ftruncate(s.fd, n); !errors.Is(err, unix.EPERM) {
			t.Fatalf("ftruncate to %d: %v, want EPERM", n, err)
		}
	}
	// Latches naming no live session: a slot nobody has, the daemon's own.
	w := s.u64(offOf(t, a, "semaphore", "stray-latch"))
	atomic.StoreUint64(w, atomic.LoadUint64(w)|uint64(4321)<<statemem.LatchShift)
	w = s.u64(offOf(t, a, "semaphore", "daemon-latch"))
	atomic.StoreUint64(w, atomic.LoadUint64(w)|uint64(statemem.LatchDaemon)<<statemem.LatchShift)
	// Owners no session has, and a daemon bit with nobody queued.
	atomic.StoreUint64(s.u64(offOf(t, a, "lock", "stray-lock")), 4321)
	atomic.StoreUint64(s.u64(offOf(t, a, "rlock", "stray-rlock")), 999|5<<statemem.DepthShift)
	atomic.StoreUint64(s.u64(offOf(t, a, "lock", "bit-lock")), statemem.BitDaemon)
	// A ledger entry of 2^32-1 for the scribbler's own slot; then its
	// session ends, and the daemon gives back what the entry says, clamped.
	ledger := atomic.LoadUint32(s.u32(offOf(t, a, "semaphore", "huge-entry") + statemem.OffLedger))
	atomic.StoreUint32(s.u32(ledger+4*s.slot), 0xFFFFFFFF)
	s.raw.nc.Close()

	alive(t, d, b)
	for _, name := range []string{"stray-latch", "daemon-latch", "huge-entry"} {
		sem, err := b.Semaphore(ctx, name, 3)
		must(t, err)
		for i := 0; i < 3; i++ {
			actx, cancel := context.WithTimeout(ctx, bound)
			ok, err := sem.AcquireTimeout(actx, bound)
			cancel()
			if !ok || err != nil {
				t.Fatalf("%s: unit %d: %v %v", name, i, ok, err)
			}
		}
		if ok, _ := sem.TryAcquire(ctx); ok {
			t.Fatalf("%s: a fourth unit", name)
		}
	}
	for _, name := range []string{"stray-lock", "bit-lock"} {
		l, err := b.Lock(ctx, name)
		must(t, err)
		if ok, err := l.AcquireTimeout(ctx, bound); !ok || err != nil {
			t.Fatalf("%s: %v %v", name, ok, err)
		}
	}
	rl, err := b.RLock(ctx, "stray-rlock")
	must(t, err)
	if ok, err := rl.AcquireTimeout(ctx, bound); !ok || err != nil {
		t.Fatalf("stray-rlock: %v %v", ok, err)
	}
	// What nobody scribbled on kept its state.
	lb, err := b.Lock(ctx, "held")
	must(t, err)
	if ok, _ := lb.TryAcquire(ctx); ok {
		t.Fatal("the held Lock was freed")
	}
	kb, err := b.Semaphore(ctx, "keep", 5)
	must(t, err)
	for i := 0; i < 3; i++ {
		if ok, _ := kb.TryAcquire(ctx); !ok {
			t.Fatalf("keep: unit %d of the 3 free is missing", i)
		}
	}
	if ok, _ := kb.TryAcquire(ctx); ok {
		t.Fatal("keep: the 2 units a holds were given away")
	}
	alive(t, d, b)
}

// A live session holds a Semaphore's latch and does not let go (stopped
// mid-op): acquires of every kind keep their timeouts, and another session
// that ends gets its units in every other Semaphore back at once, and in
// that one when the latch is let go.
func TestHeldLatchBlocksNobody(t *testing.T) {
	d := startDaemon(t)
	a := d.dial(t, proxy.WithFastPath())
	sock := d.dial(t)
	ctx := context.Background()
	stuck, err := a.Semaphore(ctx, "stuck", 3)
	must(t, err)
	other, err := a.Semaphore(ctx, "other", 5)
	must(t, err)
	ending := d.dial(t, proxy.WithFastPath())
	eo, err := ending.Semaphore(ctx, "other", 5)
	must(t, err)
	es, err := ending.Semaphore(ctx, "stuck", 3)
	must(t, err)
	for i := 0; i < 5; i++ {
		must(t, eo.Acquire(ctx))
	}
	must(t, es.Acquire(ctx))

	s := scribble(t, d) // a live attached session: its latch is waited for, within deadlines
	w := s.u64(offOf(t, a, "semaphore", "stuck"))
	atomic.StoreUint64(w, atomic.LoadUint64(w)|uint64(s.slot)<<statemem.LatchShift)

	ss, err := sock.Semaphore(ctx, "stuck", 3)
	must(t, err)
	for _, m := range []*proxy.Mutex{stuck, ss} {
		start := time.Now()
		if ok, err := m.TryAcquire(ctx); ok || err != nil {
			t.Fatalf("non-blocking acquire behind a held latch: %v %v", ok, err)
		}
		if e := time.Since(start); e > bound/2 {
			t.Fatalf("non-blocking acquire took %v", e)
		}
		start = time.Now()
		if ok, err := m.AcquireTimeout(ctx, 300*time.Millisecond); ok || err != nil {
			t.Fatalf("acquire(timeout=0.3) behind a held latch: %v %v", ok, err)
		}
		if e := time.Since(start); e > bound/2 {
			t.Fatalf("acquire(timeout=0.3) took %v", e)
		}
	}

	ending.Close()
	waitFree(t, other, 5)
	s.raw.nc.Close() // the holder's session ends: the daemon takes its latch over
	waitFree(t, stuck, 3)
	alive(t, d, sock)
}

// waitFree waits until n units of m can be taken (and gives them back).
func waitFree(t *testing.T, m *proxy.Mutex, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		if ok, err := m.AcquireTimeout(ctx, bound); !ok || err != nil {
			t.Fatalf("unit %d of %d did not come back: %v %v", i+1, n, ok, err)
		}
	}
	for i := 0; i < n; i++ {
		must(t, m.Release(ctx))
	}
}

// A standalone daemon SIGKILLed leaves no segment behind: the segment is an
// anonymous memory file, in /dev/shm or anywhere.
func TestSIGKILLedDaemonLeavesNoSegment(t *testing.T) {
	list := func() map[string]bool {
		m := map[string]bool{}
		ents, _ := os.ReadDir("/dev/shm")
		for _, e := range ents {
			m[e.Name()] = true
		}
		return m
	}
	before := list()
	d := startDaemon(t)
	c := d.dial(t, proxy.WithFastPath())
	if ok, why := c.FastPath(); !ok {
		t.Fatalf("no fast path: %s", why)
	}
	d.kill()
	for name := range list() {
		if !before[name] && strings.HasPrefix(name, "syncmgr") {
			t.Errorf("left in /dev/shm: %s", name)
		}
	}
	ents, _ := os.ReadDir(strings.TrimSuffix(d.sock, "/d.sock"))
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "d.sock") { // the socket and its lock file
			t.Errorf("left beside the socket: %s", e.Name())
		}
	}
}
