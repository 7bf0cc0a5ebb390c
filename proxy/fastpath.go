package proxy

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

// The same-host fast path (docs/protocol.md section 11): with WithFastPath,
// a client on the daemon's Unix socket and host maps the daemon's state
// segment, and the Lock, RLock, Condition-lock, Semaphore and Event handles
// it creates change their words by compare-and-swap. Everything a word
// cannot do (the daemon bit set, errors, Values) goes over the socket as
// before. The client's connection is the session whose slot id the words
// name, so the fast path ends when the connection does.

// fastWait bounds one futex sleep, so that a cancelled context or a dead
// connection is noticed within it. A contended wait stays on the futex for
// its whole timeout, in such slices, carrying its statemem.Wait (waiter
// record, heir reservation) from one to the next, as the Python client's
// single sleep does.
const fastWait = 20 * time.Millisecond

// WithFastPath asks for the same-host fast path; Dial falls back to the
// socket silently when it is not available (FastPath reports which).
// SYNCMGR_FASTPATH=0 in the environment turns it off.
func WithFastPath() Option { return func(o *options) { o.fast = true } }

// fastPath is a client's mapping of the state segment.
type fastPath struct {
	seg  *statemem.Segment
	slot uint32
}

// fastWord is a handle's words.
type fastWord struct {
	fp    *fastPath // keeps the mapping alive while a handle uses it
	w     *uint64
	aux   *uint64
	since *uint64 // stamped when a Lock or RLock is taken, for status
	taken *uint32 // a Semaphore's ledger entry of this session
	kind  uint8
	alive <-chan struct{}
}

// FastPath reports whether the client uses the fast path, and if not why.
func (c *Client) FastPath() (bool, string) {
	if c.fast != nil {
		return true, ""
	}
	return false, c.fastWhy
}

func localBootID() string {
	if id := os.Getenv("SYNCMGR_FASTPATH_BOOT_ID"); id != "" {
		return id
	}
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// attachFast maps the daemon's segment, or records why not.
func (c *Client) attachFast(ctx context.Context, network string) {
	if os.Getenv("SYNCMGR_FASTPATH") == "0" {
		c.fastWhy = "SYNCMGR_FASTPATH=0"
		return
	}
	if network != "unix" {
		c.fastWhy = "not a Unix socket"
		return
	}
	res, err := c.Call(ctx, wire.OpFastpathAttach, map[string]any{}, nil)
	if err != nil {
		c.fastWhy = err.Error()
		return
	}
	m, _ := res.(map[string]any)
	path, _ := m["path"].(string)
	size, ok1 := toInt(m["size"])
	slot, ok2 := toInt(m["slot"])
	boot, _ := m["boot_id"].(string)
	if path == "" || !ok1 || !ok2 || slot <= 0 || uint32(slot) > statemem.MaxSlot {
		c.fastWhy = fmt.Sprintf("unexpected fastpath_attach reply %v", res)
		return
	}
	if boot == "" || boot != localBootID() {
		c.fastWhy = "the daemon is on another host (boot id differs)"
		return
	}
	seg, err := statemem.Open(path, int64(size))
	if err != nil {
		c.fastWhy = err.Error()
		return
	}
	fp := &fastPath{seg: seg, slot: uint32(slot)}
	// Unmapped only once no handle can reach it (a handle in a futex wait
	// keeps fp reachable).
	runtime.AddCleanup(fp, func(s *statemem.Segment) { s.Close() }, seg)
	c.fast = fp
}

// fastRef looks up h's words; nil means the socket path.
func (c *Client) fastRef(ctx context.Context, h Handle) *fastWord {
	fp := c.fast
	if fp == nil {
		return nil
	}
	switch h.kind {
	case wire.KindLock, wire.KindRLock, wire.KindCondition, wire.KindEvent, wire.KindSemaphore, wire.KindBoundedSemaphore:
	default:
		return nil
	}
	res, err := c.Call(ctx, wire.OpFastpathRef, h.args(), nil)
	if err != nil {
		return nil
	}
	m, _ := res.(map[string]any)
	off, ok1 := toInt(m["off"])
	tag, ok2 := toInt(m["tag"])
	if !ok1 || !ok2 || off <= 0 || !fp.seg.Valid(uint32(off)) {
		return nil
	}
	o := uint32(off)
	if *fp.seg.Tag(o) != uint32(tag) {
		return nil // deleted and reused since the reply
	}
	f := &fastWord{fp: fp, w: fp.seg.State(o), aux: fp.seg.Aux(o), since: fp.seg.Since(o), kind: uint8(tag), alive: c.done}
	if f.kind == statemem.KindSemaphore || f.kind == statemem.KindBoundedSemaphore {
		if f.taken = fp.seg.Ledger(o, fp.slot); f.taken == nil {
			return nil // a slot id past the ledger: units through the daemon
		}
	}
	return f
}

// usable reports whether the words may be used now: the connection, and so
// the session named in them, is alive.
func (f *fastWord) usable() bool {
	if f == nil {
		return false
	}
	select {
	case <-f.alive:
		return false
	default:
		return true
	}
}

// acquire takes the lock, waiting until deadline (zero: no limit) or ctx
// ends, in bounded futex sleeps. It returns statemem.Daemon to send the op
// over the socket.
func (f *fastWord) acquire(ctx context.Context, tid int64, wait bool, deadline time.Time) (r statemem.Result, err error) {
	wt := f.fp.seg.NewWait(f.fp.slot)
	defer func() { wt.Done(f.w, r) }()
	for {
		d := time.Duration(0)
		if wait {
			d = fastWait
			if !deadline.IsZero() {
				if left := time.Until(deadline); left < d {
					d = max(left, 0)
				}
			}
		}
		if f.taken != nil {
			r = statemem.SemAcquireWait(f.w, f.taken, f.fp.slot, d, wt)
		} else if f.kind == statemem.KindRLock {
			r = statemem.RLockAcquireWait(f.w, f.aux, f.fp.slot, tid, d, wt)
			if r == statemem.OK && atomic.LoadUint64(f.w)>>statemem.DepthShift == 1 {
				statemem.Stamp(f.since) // the outermost acquire
			}
		} else if r = statemem.LockAcquireWait(f.w, f.aux, f.fp.slot, tid, d, wt); r == statemem.OK {
			statemem.Stamp(f.since)
		}
		if r != statemem.Busy || d == 0 {
			return r, nil
		}
		if err := ctx.Err(); err != nil {
			return statemem.Busy, err
		}
		if !f.usable() {
			return statemem.Daemon, nil // the socket path reports the lost connection
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return statemem.Busy, nil
		}
	}
}

func (f *fastWord) release(tid int64) statemem.Result {
	if f.taken != nil {
		return statemem.SemRelease(f.w, f.taken, f.fp.slot)
	}
	if f.kind == statemem.KindRLock {
		return statemem.RLockRelease(f.w, f.aux, f.fp.slot, tid)
	}
	return statemem.LockRelease(f.w, f.aux)
}
