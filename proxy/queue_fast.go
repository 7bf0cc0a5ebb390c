package proxy

import (
	"context"
	"errors"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

// The Queue ring (docs/protocol.md section 11): with WithFastPath, a Queue
// or JoinableQueue maps the ring the daemon keeps its items in, passed by
// queue_attach with SCM_RIGHTS on the client's own connection, and Put,
// TryPut, Get, TryGet and Len (and a JoinableQueue's TaskDone and Join)
// work on it with no round trip (statemem.ClientRing: the protocol of the
// Python client's extension). Items are stored as the socket path stores
// them (EncodeValue), so Go, Python and socket clients share one FIFO. A
// JoinableQueue's task counts are in its ring as well: the client asks
// for it with tasks (it keeps its debts and journal, docs/protocol.md),
// and the reply's joinable must match the handle's kind. Whatever the ring
// answers Daemon for (a flag set, an item over the inline maximum, no room
// left, a latch held too long, damage) goes over the socket, with what is
// left of the context.

// queueRef maps h's ring; nil means the socket path.
func (c *Client) queueRef(h Handle) *statemem.ClientRing {
	fp := c.fast
	joinable := h.kind == wire.KindJoinableQueue
	if fp == nil || h.kind != wire.KindQueue && !joinable || fp.slot >= statemem.RingSlots {
		return nil
	}
	// tasks: this client keeps a JoinableQueue's task counts in its ring.
	res, fds, err := c.callFDs(wire.OpQueueAttach, h.args(wire.ArgTasks, true))
	defer closeFDs(fds)
	if err != nil || len(fds) != 1 {
		return nil
	}
	m, _ := res.(map[string]any)
	size, ok1 := toInt(m["size"])
	capacity, ok2 := toInt(m["capacity"])
	inline, ok3 := toInt(m["inline"])
	maxsize, ok4 := toInt(m["maxsize"])
	slot, ok5 := toInt(m["slot"])
	j, ok6 := m["joinable"].(bool)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || j != joinable || slot != int(fp.slot) || capacity < 0 || inline < 0 || maxsize < 0 {
		return nil
	}
	r, err := statemem.OpenRing(fds[0], int64(size), uint64(capacity), uint64(inline), uint64(maxsize), fp.slot, joinable)
	if err != nil {
		return nil
	}
	return r
}

// callFDs sends a request whose reply carries descriptors (queue_attach)
// and waits for the reply, which the daemon sends at once; the caller
// closes the descriptors.
func (c *Client) callFDs(op string, args map[string]any) (any, []int, error) {
	ch := make(chan outcome, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, nil, c.err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	if c.fdCalls == nil {
		c.fdCalls = make(map[uint64]bool)
	}
	c.fdCalls[id] = true
	c.mu.Unlock()
	if err := c.send(id, op, args); err != nil {
		c.mu.Lock()
		if c.pending != nil {
			delete(c.pending, id)
		}
		delete(c.fdCalls, id)
		c.mu.Unlock()
		return nil, nil, err
	}
	o := <-ch // the reply, or the connection's error
	c.mu.Lock()
	delete(c.fdCalls, id)
	c.mu.Unlock()
	res, err := result(o)
	if err != nil {
		closeFDs(o.fds)
		return nil, nil, err
	}
	return res, o.fds, nil
}

// fdReader is the reply reader of a fast-path client: it keeps the
// descriptors passed with a reply (nil: the connection's plain reads).
func (c *Client) fdReader() *rightsReader {
	uc, ok := c.nc.(*net.UnixConn)
	if c.fast == nil || !ok {
		return nil
	}
	return &rightsReader{uc: uc}
}

// take returns the descriptors received since the last take. The daemon
// writes a reply that carries descriptors with one sendmsg, and a frame is
// read in exact-size reads, so they came with the frame just read.
func (r *rightsReader) take() []int {
	if r == nil || len(r.fds) == 0 {
		return nil
	}
	fds := r.fds
	r.fds = nil
	return fds
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// alive reports whether the connection, and so the session whose slot id
// the ring's latch names, is alive.
func (q *Queue) alive() bool {
	select {
	case <-q.c.done:
		return false
	default:
		return true
	}
}

// slice is how long the next ring wait may sleep: fastWait, or what is left
// of ctx's deadline (0 once it has passed); wait false: 0.
func slice(ctx context.Context, wait bool) time.Duration {
	if !wait {
		return 0
	}
	d := fastWait
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, max(time.Until(dl), 0))
	}
	return d
}

// ringEnd is what a ring op that found the queue full (empty) returns once
// it may wait no longer: none (ErrFull or ErrEmpty) when it may not wait
// or ctx's deadline passed, ctx's error when ctx was cancelled, nil while
// it may still wait.
func ringEnd(ctx context.Context, wait bool, none error) error {
	if !wait {
		return none
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return none
	}
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return none
		}
		return err
	}
	return nil
}

// fastPut puts the encoded item b on the ring; false: send it over the
// socket (nothing was stored).
func (q *Queue) fastPut(ctx context.Context, b []byte, wait bool) (bool, error) {
	if err := ctx.Err(); errors.Is(err, context.Canceled) {
		return true, err
	}
	for q.alive() {
		switch q.qr.Put(b, slice(ctx, wait)) {
		case statemem.OK:
			return true, nil
		case statemem.Daemon:
			return false, nil
		}
		if err := ringEnd(ctx, wait, wire.Errorf(wire.CodeFull, "queue %q is full", q.name)); err != nil {
			return true, err
		}
	}
	return false, nil // the socket path reports the lost connection
}

// fastGet gets the head item from the ring, decoded; false: send the op
// over the socket (nothing was taken). An item that does not decode stays
// at the head: the error costs nothing.
func (q *Queue) fastGet(ctx context.Context, wait bool) (bool, any, error) {
	if err := ctx.Err(); errors.Is(err, context.Canceled) {
		return true, nil, err
	}
	var v any
	take := func(p []byte) error {
		x, err := DecodeValue(p)
		v = x
		return err
	}
	for q.alive() {
		res, err := q.qr.Get(slice(ctx, wait), take)
		switch {
		case err != nil:
			return true, nil, err
		case res == statemem.OK:
			return true, v, nil
		case res == statemem.Daemon:
			return false, nil, nil
		}
		if err := ringEnd(ctx, wait, wire.Errorf(wire.CodeEmpty, "queue %q is empty", q.name)); err != nil {
			return true, nil, err
		}
	}
	return false, nil, nil
}

// fastTaskDone marks a task done on the ring; false: send it over the
// socket (nothing was stored). Called too many times: a value error, and
// nothing stored.
func (q *JoinableQueue) fastTaskDone(ctx context.Context) (bool, error) {
	if err := ctx.Err(); errors.Is(err, context.Canceled) {
		return true, err
	}
	if !q.alive() {
		return false, nil // the socket path reports the lost connection
	}
	switch q.qr.TaskDone() {
	case statemem.OK:
		return true, nil
	case statemem.Busy:
		return true, wire.Errorf(wire.CodeValueError, "task_done() called too many times")
	}
	return false, nil
}

// fastJoin waits on the ring until no task is unfinished, in slices of
// the context; false: ask the daemon. Ending (a deadline: DeadlineExceeded,
// a cancel: ctx's error) takes nothing.
func (q *JoinableQueue) fastJoin(ctx context.Context) (bool, error) {
	if err := ctx.Err(); errors.Is(err, context.Canceled) {
		return true, err
	}
	for q.alive() {
		switch q.qr.Join(slice(ctx, true)) {
		case statemem.OK:
			return true, nil
		case statemem.Daemon:
			return false, nil
		}
		if err := ringEnd(ctx, true, context.DeadlineExceeded); err != nil {
			return true, err
		}
	}
	return false, nil
}

// FastPath reports whether the queue's items are on the fast path (its
// ring mapped); ops still go to the daemon whenever the ring says so.
func (q *Queue) FastPath() bool { return q.qr != nil }
