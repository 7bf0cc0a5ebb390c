package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

// Handles of the sync family: Lock, RLock, Semaphore, BoundedSemaphore,
// Event, Value, Condition and Barrier.

// Mutex is a Lock, RLock, Semaphore or BoundedSemaphore.
type Mutex struct {
	Handle
	tid int64
}

// Lock returns the named Lock, creating it if needed ("" for anonymous).
func (c *Client) Lock(ctx context.Context, name string) (*Mutex, error) {
	h, err := c.create(ctx, wire.KindLock, name)
	return &Mutex{Handle: h}, err
}

// RLock returns the named RLock. All goroutines using one handle share its
// owner id; use WithOwner for distinct owners.
func (c *Client) RLock(ctx context.Context, name string) (*Mutex, error) {
	h, err := c.create(ctx, wire.KindRLock, name)
	return &Mutex{Handle: h}, err
}

// Semaphore returns the named Semaphore with an initial value.
func (c *Client) Semaphore(ctx context.Context, name string, value int) (*Mutex, error) {
	h, err := c.create(ctx, wire.KindSemaphore, name, wire.ArgValue, value)
	return &Mutex{Handle: h}, err
}

// BoundedSemaphore returns the named BoundedSemaphore.
func (c *Client) BoundedSemaphore(ctx context.Context, name string, value int) (*Mutex, error) {
	h, err := c.create(ctx, wire.KindBoundedSemaphore, name, wire.ArgValue, value)
	return &Mutex{Handle: h}, err
}

// WithOwner returns a copy of m acquiring as owner id tid (for RLock).
func (m *Mutex) WithOwner(tid int64) *Mutex {
	n := *m
	n.tid = tid
	return &n
}

// fastAcquire tries the fast path; done false means "use the socket".
func (m *Mutex) fastAcquire(ctx context.Context, wait bool, deadline time.Time) (ok, done bool, err error) {
	if !m.fw.usable() {
		return false, false, nil
	}
	r, err := m.fw.acquire(ctx, m.tid, wait, deadline)
	switch {
	case err != nil:
		return false, true, err
	case r == statemem.OK:
		return true, true, nil
	case r == statemem.Busy:
		return false, true, nil
	}
	return false, false, nil
}

// Acquire blocks until acquired or ctx ends.
func (m *Mutex) Acquire(ctx context.Context) error {
	dl, _ := ctx.Deadline()
	if ok, done, err := m.fastAcquire(ctx, true, dl); done {
		if err == nil && !ok {
			err = context.DeadlineExceeded
		}
		return err
	}
	res, err := m.call(ctx, wire.OpAcquire, m.undoAcquire, append([]any{wire.ArgTID, m.tid}, timeoutArgs(ctx)...)...)
	if err != nil {
		return err
	}
	if res != true {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return context.DeadlineExceeded
	}
	return nil
}

// TryAcquire acquires without waiting; it reports whether it did.
func (m *Mutex) TryAcquire(ctx context.Context) (bool, error) {
	if ok, done, err := m.fastAcquire(ctx, false, time.Time{}); done {
		return ok, err
	}
	res, err := m.call(ctx, wire.OpAcquire, m.undoAcquire, wire.ArgTID, m.tid, wire.ArgBlock, false)
	return res == true, err
}

// AcquireTimeout waits at most d; it reports whether it acquired.
func (m *Mutex) AcquireTimeout(ctx context.Context, d time.Duration) (bool, error) {
	start := time.Now()
	if ok, done, err := m.fastAcquire(ctx, d > 0, start.Add(d)); done {
		return ok, err
	}
	d = max(d-time.Since(start), 0)
	res, err := m.call(ctx, wire.OpAcquire, m.undoAcquire, wire.ArgTID, m.tid, wire.ArgTimeout, d.Seconds())
	return res == true, err
}

func (m *Mutex) undoAcquire(res any) {
	if res == true {
		_ = m.c.Notify(wire.OpRelease, m.args(wire.ArgTID, m.tid))
	}
}

// Release releases once. It names the daemon run the client connected
// to, so that a daemon restarted since then refuses it (server_restarted)
// instead of releasing a lock someone else acquired after the restart.
func (m *Mutex) Release(ctx context.Context) error {
	if m.fw.usable() && m.fw.release(m.tid) == statemem.OK {
		return nil
	}
	kv := []any{wire.ArgTID, m.tid}
	if run := m.c.info.RunID; run != "" {
		kv = append(kv, wire.ArgRun, run)
	}
	_, err := m.call(ctx, wire.OpRelease, nil, kv...)
	return err
}

// Event is a shared threading.Event.
type Event struct{ Handle }

// Event returns the named Event.
func (c *Client) Event(ctx context.Context, name string) (*Event, error) {
	h, err := c.create(ctx, wire.KindEvent, name)
	return &Event{h}, err
}

// Set sets the flag and wakes all waiters.
func (e *Event) Set(ctx context.Context) error {
	if e.fw.usable() && statemem.EventSet(e.fw.w) == statemem.OK {
		return nil
	}
	_, err := e.call(ctx, wire.OpSet, nil)
	return err
}

// Clear clears the flag.
func (e *Event) Clear(ctx context.Context) error {
	if e.fw.usable() {
		statemem.EventClear(e.fw.w)
		return nil
	}
	_, err := e.call(ctx, wire.OpClear, nil)
	return err
}

// IsSet reports the flag.
func (e *Event) IsSet(ctx context.Context) (bool, error) {
	if e.fw.usable() {
		return statemem.EventIsSet(e.fw.w), nil
	}
	res, err := e.call(ctx, wire.OpIsSet, nil)
	return res == true, err
}

// fastWait waits on the word, for the whole wait, in bounded sleeps (to
// notice ctx and the connection); done false means "use the socket" (the
// connection is gone).
func (e *Event) fastWait(ctx context.Context, deadline time.Time) (set, done bool, since int64, err error) {
	if !e.fw.usable() {
		return false, false, -1, nil
	}
	gen := statemem.EventGen(e.fw.w)
	wt := e.fw.fp.seg.NewWait(e.fw.fp.slot)
	defer wt.Done(e.fw.w, statemem.OK)
	for {
		d := fastWait
		if !deadline.IsZero() {
			if left := time.Until(deadline); left < d {
				d = max(left, 0)
			}
		}
		if statemem.EventWaitSinceWait(e.fw.w, gen, d, wt) {
			return true, true, -1, nil
		}
		if err := ctx.Err(); err != nil {
			return false, true, -1, err
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return false, true, -1, nil
		}
		if !e.fw.usable() {
			return false, false, -1, nil
		}
	}
}

// sinceArgs passes a fast-path waiter's generation to the daemon.
func sinceArgs(since int64, args ...any) []any {
	if since >= 0 {
		return append(args, wire.ArgSince, since)
	}
	return args
}

// Wait blocks until the flag is set or ctx ends.
func (e *Event) Wait(ctx context.Context) error {
	dl, _ := ctx.Deadline()
	set, done, since, err := e.fastWait(ctx, dl)
	if done {
		if err == nil && !set {
			err = context.DeadlineExceeded
		}
		return err
	}
	res, err := e.call(ctx, wire.OpWait, nil, sinceArgs(since, timeoutArgs(ctx)...)...)
	if err != nil {
		return err
	}
	if res != true {
		return context.DeadlineExceeded
	}
	return nil
}

// WaitTimeout waits at most d and returns the flag.
func (e *Event) WaitTimeout(ctx context.Context, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	set, done, since, err := e.fastWait(ctx, deadline)
	if done {
		return set, err
	}
	left := max(time.Until(deadline), 0)
	res, err := e.call(ctx, wire.OpWait, nil, sinceArgs(since, wire.ArgTimeout, left.Seconds())...)
	return res == true, err
}

// Value is a shared typed value. Typecode "O" holds any value in the
// encoding both clients share (see EncodeValue); the numeric typecodes hold
// numbers the daemon adds and compares itself.
type Value struct {
	Handle
	typecode string
}

// Value returns the named Value with a typecode and initial value.
func (c *Client) Value(ctx context.Context, name, typecode string, initial any) (*Value, error) {
	if typecode == "O" && initial != nil {
		b, err := EncodeValue(initial)
		if err != nil {
			return nil, err
		}
		initial = b
	}
	h, err := c.create(ctx, wire.KindValue, name, wire.ArgTypecode, typecode, wire.ArgValue, initial)
	return &Value{h, typecode}, err
}

// Get returns the value: int64, uint64, float64, bool or []byte for the
// numeric typecodes and "c", a decoded value (see DecodeValue) for "O".
func (v *Value) Get(ctx context.Context) (any, error) {
	res, err := v.call(ctx, wire.OpGet, nil)
	if err != nil || v.typecode != "O" {
		return res, err
	}
	b, _ := res.([]byte)
	if len(b) == 0 {
		return nil, nil // never set
	}
	return DecodeValue(b)
}

// Set replaces the value.
func (v *Value) Set(ctx context.Context, x any) error {
	if v.typecode == "O" {
		b, err := EncodeValue(x)
		if err != nil {
			return err
		}
		x = b
	}
	_, err := v.call(ctx, wire.OpSet, nil, wire.ArgValue, x)
	return err
}

// Add adds delta atomically and returns the new value.
func (v *Value) Add(ctx context.Context, delta any) (any, error) {
	return v.call(ctx, wire.OpAdd, nil, wire.ArgDelta, delta)
}

// CompareAndSet replaces the value with next if it equals expected.
func (v *Value) CompareAndSet(ctx context.Context, expected, next any) (bool, error) {
	res, err := v.call(ctx, wire.OpCAS, nil, wire.ArgExpected, expected, wire.ArgNew, next)
	return res == true, err
}

// Condition is a shared threading.Condition over a Lock or RLock.
type Condition struct {
	Mutex
}

// Condition returns the named Condition. lock names an existing Lock or
// RLock; "" gives the condition a private RLock.
func (c *Client) Condition(ctx context.Context, name, lock string) (*Condition, error) {
	kv := []any{}
	if lock != "" {
		kv = append(kv, wire.ArgLock, lock)
	}
	h, err := c.create(ctx, wire.KindCondition, name, kv...)
	return &Condition{Mutex{Handle: h}}, err
}

// Wait releases the lock, waits for a notify (or ctx's deadline) and
// reacquires the lock. It reports whether it was notified.
func (cv *Condition) Wait(ctx context.Context) (bool, error) {
	res, err := cv.call(ctx, wire.OpWait, nil, append([]any{wire.ArgTID, cv.tid}, timeoutArgs(ctx)...)...)
	return res == true, err
}

// Notify wakes up to n waiters; the caller must hold the lock.
func (cv *Condition) Notify(ctx context.Context, n int) error {
	_, err := cv.call(ctx, wire.OpNotify, nil, wire.ArgTID, cv.tid, wire.ArgN, n)
	return err
}

// NotifyAll wakes every waiter; the caller must hold the lock.
func (cv *Condition) NotifyAll(ctx context.Context) error {
	_, err := cv.call(ctx, wire.OpNotifyAll, nil, wire.ArgTID, cv.tid)
	return err
}

// Barrier is a shared threading.Barrier.
type Barrier struct {
	Handle
	action func() error
}

// Barrier returns the named Barrier for parties. action, if not nil, runs in
// the client of the last party to arrive before the others are released
// (every client of the barrier must pass the same action).
func (c *Client) Barrier(ctx context.Context, name string, parties int, action func() error) (*Barrier, error) {
	h, err := c.create(ctx, wire.KindBarrier, name, wire.ArgParties, parties, wire.ArgAction, action != nil)
	return &Barrier{Handle: h, action: action}, err
}

// Wait waits for all parties and returns this party's index.
func (b *Barrier) Wait(ctx context.Context) (int, error) {
	res, err := b.call(ctx, wire.OpWait, nil, timeoutArgs(ctx)...)
	if err != nil {
		return 0, err
	}
	m, _ := res.(map[string]any)
	idx, _ := toInt(m["index"])
	if m["action"] == true {
		var aerr error
		if b.action != nil {
			aerr = b.action()
		}
		if _, err := b.call(ctx, wire.OpActionDone, nil, wire.ArgOK, aerr == nil); err != nil {
			return idx, err
		}
		if aerr != nil {
			return idx, fmt.Errorf("barrier action: %w", aerr)
		}
	}
	return idx, nil
}

// Abort breaks the barrier.
func (b *Barrier) Abort(ctx context.Context) error {
	_, err := b.call(ctx, wire.OpAbort, nil)
	return err
}

// Reset returns the barrier to its initial state.
func (b *Barrier) Reset(ctx context.Context) error {
	_, err := b.call(ctx, wire.OpReset, nil)
	return err
}

// Broken reports whether the barrier is broken.
func (b *Barrier) Broken(ctx context.Context) (bool, error) {
	res, err := b.call(ctx, wire.OpBroken, nil)
	return res == true, err
}
