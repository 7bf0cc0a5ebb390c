package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
	"golang.org/x/sys/unix"
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
	run  string // the daemon run whose segment this is
}

// fastWord is a handle's words.
type fastWord struct {
	fp    *fastPath // keeps the mapping alive while a handle uses it
	w     *uint64
	aux   *uint64
	since *uint64 // stamped when a Lock or RLock is taken, for status
	taken *uint32 // a Semaphore's ledger entry of this session
	kind  uint8
	ops   *wordOps // by kind
	alive <-chan struct{}
}

// wordKinds are the wire kinds whose handles use a word on the fast path,
// one line each.
var wordKinds = map[string]bool{
	wire.KindLock:             true,
	wire.KindRLock:            true,
	wire.KindCondition:        true, // its lock's word
	wire.KindEvent:            true, // sync.go uses the word itself
	wire.KindSemaphore:        true,
	wire.KindBoundedSemaphore: true,
}

// wordOps is how a Mutex handle takes and gives back a word of one kind
// (the kind in the slot's tag).
type wordOps struct {
	// ledger: the ops need this session's ledger entry (fastWord.taken);
	// without one (a slot id past the ledger) the handle stays on the
	// socket.
	ledger bool
	// acquire makes one attempt of at most d (see fastWord.acquire).
	acquire func(f *fastWord, tid int64, d time.Duration, wt *statemem.Wait) statemem.Result
	release func(f *fastWord, tid int64) statemem.Result
}

// wordOpsByKind are the ops of each tag kind, one line each (each kind's
// are in a file of its own: fast_lock.go, fast_semaphore.go); any other
// kind (an Event's, whose handle never acquires) has lockOps.
var wordOpsByKind = map[uint8]*wordOps{
	statemem.KindLock:             &lockOps,
	statemem.KindRLock:            &rlockOps,
	statemem.KindSemaphore:        &semaphoreOps,
	statemem.KindBoundedSemaphore: &semaphoreOps,
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

// attachFast maps the daemon's segment, or records why not. It runs
// before the reply reader starts: the reply to fastpath_attach carries the
// segment's descriptor (SCM_RIGHTS), which only a recvmsg of the reply's
// first bytes receives. Only a failure to exchange the request and reply
// is an error (the connection's stream is then unusable); anything else
// leaves the client on the socket path, with the reason in fastWhy.
func (c *Client) attachFast(ctx context.Context, network string) error {
	if os.Getenv("SYNCMGR_FASTPATH") == "0" {
		c.fastWhy = "SYNCMGR_FASTPATH=0"
		return nil
	}
	uc, ok := c.nc.(*net.UnixConn)
	if network != "unix" || !ok {
		c.fastWhy = "not a Unix socket"
		return nil
	}
	res, fds, err := c.attachRequest(ctx, uc)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if err != nil {
		if _, refused := err.(*wire.Error); !refused {
			return err
		}
		c.fastWhy = err.Error()
		return nil
	}
	m, _ := res.(map[string]any)
	size, ok1 := toInt(m["size"])
	slot, ok2 := toInt(m["slot"])
	boot, _ := m["boot_id"].(string)
	run, _ := m["run"].(string)
	if !ok1 || !ok2 || slot <= 0 || uint32(slot) > statemem.MaxSlot || run == "" || run != c.info.RunID {
		c.fastWhy = fmt.Sprintf("unexpected fastpath_attach reply %v", res)
		return nil
	}
	if len(fds) != 1 {
		c.fastWhy = fmt.Sprintf("fastpath_attach passed %d descriptors, want 1", len(fds))
		return nil
	}
	if boot == "" || boot != localBootID() {
		c.fastWhy = "the daemon is on another host (boot id differs)"
		return nil
	}
	seg, err := statemem.OpenFD(fds[0], int64(size))
	if err != nil {
		c.fastWhy = err.Error()
		return nil
	}
	fp := &fastPath{seg: seg, slot: uint32(slot), run: run}
	// Unmapped only once no handle can reach it (a handle in a futex wait
	// keeps fp reachable).
	runtime.AddCleanup(fp, func(s *statemem.Segment) { s.Close() }, seg)
	c.fast = fp
	return nil
}

// attachRequest sends fastpath_attach and reads its reply with the
// descriptors that came with it (the caller closes them).
func (c *Client) attachRequest(ctx context.Context, uc *net.UnixConn) (any, []int, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(10 * time.Second)
	}
	_ = uc.SetDeadline(dl)
	defer uc.SetDeadline(time.Time{})
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	c.mu.Unlock()
	frame, err := wire.EncodeRequest(id, wire.OpFastpathAttach, map[string]any{})
	if err != nil {
		return nil, nil, err
	}
	if _, err := uc.Write(frame); err != nil {
		return nil, nil, err
	}
	r := &rightsReader{uc: uc}
	body, err := wire.ReadFrame(r, c.info.MaxFrame+1024)
	if err != nil {
		return nil, r.fds, err
	}
	rep, err := wire.DecodeReply(body)
	if err != nil {
		return nil, r.fds, err
	}
	if rep.ID != id {
		return nil, r.fds, fmt.Errorf("fastpath_attach: reply to request %d, want %d", rep.ID, id)
	}
	if rep.Err != nil {
		return nil, r.fds, rep.Err
	}
	return rep.Result, r.fds, nil
}

// rightsReader reads a Unix socket with recvmsg, keeping every descriptor
// passed with the bytes it reads.
type rightsReader struct {
	uc  *net.UnixConn
	fds []int
}

func (r *rightsReader) Read(p []byte) (int, error) {
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := r.uc.ReadMsgUnix(p, oob)
	if oobn > 0 {
		if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if fds, ferr := unix.ParseUnixRights(&m); ferr == nil {
					r.fds = append(r.fds, fds...)
				}
			}
		}
	}
	if n == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

// wordKind reports whether kind's state is a word this client uses on the
// fast path.
func wordKind(kind string) bool { return wordKinds[kind] }

// fastRef looks up h's words; nil means the socket path. hint is the
// create reply's "fp" ([offset, tag, run]: the fastpath_ref answer, in an
// array); without it, fastpath_ref is asked.
func (c *Client) fastRef(ctx context.Context, h Handle, hint any) *fastWord {
	fp := c.fast
	if fp == nil || !wordKind(h.kind) {
		return nil
	}
	var offV, tagV, runV any
	if a, _ := hint.([]any); len(a) == 3 {
		offV, tagV, runV = a[0], a[1], a[2]
	} else {
		res, err := c.Call(ctx, wire.OpFastpathRef, h.args(), nil)
		if err != nil {
			return nil
		}
		m, _ := res.(map[string]any)
		offV, tagV, runV = m["off"], m["tag"], m["run"]
	}
	if run, _ := runV.(string); run != fp.run {
		return nil // another run's offsets: not into this segment
	}
	off, ok1 := toInt(offV)
	tag, ok2 := toInt(tagV)
	if !ok1 || !ok2 || off <= 0 || !fp.seg.Valid(uint32(off)) {
		return nil
	}
	o := uint32(off)
	if *fp.seg.Tag(o) != uint32(tag) {
		return nil // deleted and reused since the reply
	}
	f := &fastWord{fp: fp, w: fp.seg.State(o), aux: fp.seg.Aux(o), since: fp.seg.Since(o), kind: uint8(tag), alive: c.done}
	if f.ops = wordOpsByKind[f.kind]; f.ops == nil {
		f.ops = &lockOps
	}
	if f.ops.ledger {
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
		r = f.ops.acquire(f, tid, d, wt)
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

func (f *fastWord) release(tid int64) statemem.Result { return f.ops.release(f, tid) }
