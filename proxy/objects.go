package proxy

import (
	"context"
	"fmt"
	"time"
)

// Handle is what every object handle has: its client, kind and name.
type Handle struct {
	c    *Client
	kind string
	name string
	anon bool
}

// Name returns the object's name (generated for anonymous objects).
func (h *Handle) Name() string { return h.name }

// Kind returns the object's wire kind.
func (h *Handle) Kind() string { return h.kind }

// Close drops this client's reference to an anonymous object, which the
// server deletes when no client references it. It is a no-op for named
// objects, which live until deleted.
func (h *Handle) Close() error {
	if !h.anon {
		return nil
	}
	return h.c.Notify("decref", map[string]any{"name": h.name})
}

func (h *Handle) args(kv ...any) map[string]any {
	m := map[string]any{"kind": h.kind, "name": h.name}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func (h *Handle) call(ctx context.Context, op string, undo func(any), kv ...any) (any, error) {
	return h.c.Call(ctx, op, h.args(kv...), undo)
}

func (c *Client) create(ctx context.Context, kind, name string, kv ...any) (Handle, error) {
	args := map[string]any{"kind": kind}
	if name != "" {
		args["name"] = name
	}
	for i := 0; i+1 < len(kv); i += 2 {
		args[kv[i].(string)] = kv[i+1]
	}
	res, err := c.Call(ctx, "create", args, nil)
	if err != nil {
		return Handle{}, err
	}
	m, ok := res.(map[string]any)
	got, _ := m["name"].(string)
	if !ok || got == "" {
		return Handle{}, fmt.Errorf("syncmgr: create: unexpected reply %v", res)
	}
	return Handle{c: c, kind: kind, name: got, anon: name == ""}, nil
}

// timeoutArgs turns ctx's deadline into the server-side timeout, so a call
// with a deadline ends on the server without a cancel round trip.
func timeoutArgs(ctx context.Context) []any {
	if dl, ok := ctx.Deadline(); ok {
		return []any{"timeout", max(time.Until(dl).Seconds(), 0)}
	}
	return nil
}

// Mutex is a Lock, RLock, Semaphore or BoundedSemaphore.
type Mutex struct {
	Handle
	tid int64
}

// Lock returns the named Lock, creating it if needed ("" for anonymous).
func (c *Client) Lock(ctx context.Context, name string) (*Mutex, error) {
	h, err := c.create(ctx, "lock", name)
	return &Mutex{Handle: h}, err
}

// RLock returns the named RLock. All goroutines using one handle share its
// owner id; use WithOwner for distinct owners.
func (c *Client) RLock(ctx context.Context, name string) (*Mutex, error) {
	h, err := c.create(ctx, "rlock", name)
	return &Mutex{Handle: h}, err
}

// Semaphore returns the named Semaphore with an initial value.
func (c *Client) Semaphore(ctx context.Context, name string, value int) (*Mutex, error) {
	h, err := c.create(ctx, "semaphore", name, "value", value)
	return &Mutex{Handle: h}, err
}

// BoundedSemaphore returns the named BoundedSemaphore.
func (c *Client) BoundedSemaphore(ctx context.Context, name string, value int) (*Mutex, error) {
	h, err := c.create(ctx, "bounded_semaphore", name, "value", value)
	return &Mutex{Handle: h}, err
}

// WithOwner returns a copy of m acquiring as owner id tid (for RLock).
func (m *Mutex) WithOwner(tid int64) *Mutex {
	n := *m
	n.tid = tid
	return &n
}

// Acquire blocks until acquired or ctx ends.
func (m *Mutex) Acquire(ctx context.Context) error {
	res, err := m.call(ctx, "acquire", m.undoAcquire, append([]any{"tid", m.tid}, timeoutArgs(ctx)...)...)
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
	res, err := m.call(ctx, "acquire", m.undoAcquire, "tid", m.tid, "block", false)
	return res == true, err
}

// AcquireTimeout waits at most d; it reports whether it acquired.
func (m *Mutex) AcquireTimeout(ctx context.Context, d time.Duration) (bool, error) {
	res, err := m.call(ctx, "acquire", m.undoAcquire, "tid", m.tid, "timeout", d.Seconds())
	return res == true, err
}

func (m *Mutex) undoAcquire(res any) {
	if res == true {
		_ = m.c.Notify("release", m.args("tid", m.tid))
	}
}

// Release releases once.
func (m *Mutex) Release(ctx context.Context) error {
	_, err := m.call(ctx, "release", nil, "tid", m.tid)
	return err
}

// Event is a shared threading.Event.
type Event struct{ Handle }

// Event returns the named Event.
func (c *Client) Event(ctx context.Context, name string) (*Event, error) {
	h, err := c.create(ctx, "event", name)
	return &Event{h}, err
}

// Set sets the flag and wakes all waiters.
func (e *Event) Set(ctx context.Context) error { _, err := e.call(ctx, "set", nil); return err }

// Clear clears the flag.
func (e *Event) Clear(ctx context.Context) error { _, err := e.call(ctx, "clear", nil); return err }

// IsSet reports the flag.
func (e *Event) IsSet(ctx context.Context) (bool, error) {
	res, err := e.call(ctx, "is_set", nil)
	return res == true, err
}

// Wait blocks until the flag is set or ctx ends.
func (e *Event) Wait(ctx context.Context) error {
	res, err := e.call(ctx, "wait", nil, timeoutArgs(ctx)...)
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
	res, err := e.call(ctx, "wait", nil, "timeout", d.Seconds())
	return res == true, err
}

// Value is a shared typed value.
type Value struct{ Handle }

// Value returns the named Value with a typecode and initial value.
func (c *Client) Value(ctx context.Context, name, typecode string, initial any) (*Value, error) {
	h, err := c.create(ctx, "value", name, "typecode", typecode, "value", initial)
	return &Value{h}, err
}

// Get returns the value (int64, uint64, float64, bool or []byte).
func (v *Value) Get(ctx context.Context) (any, error) { return v.call(ctx, "get", nil) }

// Set replaces the value.
func (v *Value) Set(ctx context.Context, x any) error {
	_, err := v.call(ctx, "set", nil, "value", x)
	return err
}

// Add adds delta atomically and returns the new value.
func (v *Value) Add(ctx context.Context, delta any) (any, error) {
	return v.call(ctx, "add", nil, "delta", delta)
}

// CompareAndSet replaces the value with next if it equals expected.
func (v *Value) CompareAndSet(ctx context.Context, expected, next any) (bool, error) {
	res, err := v.call(ctx, "cas", nil, "expected", expected, "new", next)
	return res == true, err
}

// Queue is a shared FIFO of byte strings.
type Queue struct{ Handle }

// Queue returns the named Queue (maxsize <= 0: unbounded).
func (c *Client) Queue(ctx context.Context, name string, maxsize int) (*Queue, error) {
	h, err := c.create(ctx, "queue", name, "maxsize", maxsize)
	return &Queue{h}, err
}

// Put appends item, waiting for room until ctx ends.
func (q *Queue) Put(ctx context.Context, item []byte) error {
	_, err := q.call(ctx, "put", nil, append([]any{"item", item}, timeoutArgs(ctx)...)...)
	return err
}

// TryPut appends without waiting; ErrFull when there is no room.
func (q *Queue) TryPut(ctx context.Context, item []byte) error {
	_, err := q.call(ctx, "put", nil, "item", item, "block", false)
	return err
}

// Get removes the first item, waiting until ctx ends (ErrEmpty on a deadline).
func (q *Queue) Get(ctx context.Context) ([]byte, error) {
	res, err := q.call(ctx, "get", q.undoGet, timeoutArgs(ctx)...)
	b, _ := res.([]byte)
	return b, err
}

// TryGet removes the first item without waiting; ErrEmpty when none.
func (q *Queue) TryGet(ctx context.Context) ([]byte, error) {
	res, err := q.call(ctx, "get", q.undoGet, "block", false)
	b, _ := res.([]byte)
	return b, err
}

func (q *Queue) undoGet(res any) {
	if b, ok := res.([]byte); ok {
		_ = q.c.Notify("unget", q.args("item", b))
	}
}

// Len returns the number of items.
func (q *Queue) Len(ctx context.Context) (int, error) {
	res, err := q.call(ctx, "qsize", nil)
	n, _ := toInt(res)
	return n, err
}

func toInt(x any) (int, bool) {
	switch v := x.(type) {
	case int64:
		return int(v), true
	case uint64:
		return int(v), true
	}
	return 0, false
}
