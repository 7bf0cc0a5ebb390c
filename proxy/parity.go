package proxy

import (
	"context"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Condition is a shared threading.Condition over a Lock or RLock.
type Condition struct {
	Mutex
}

// Condition returns the named Condition. lock names an existing Lock or
// RLock; "" gives the condition a private RLock.
func (c *Client) Condition(ctx context.Context, name, lock string) (*Condition, error) {
	kv := []any{}
	if lock != "" {
		kv = append(kv, "lock", lock)
	}
	h, err := c.create(ctx, "condition", name, kv...)
	return &Condition{Mutex{Handle: h}}, err
}

// Wait releases the lock, waits for a notify (or ctx's deadline) and
// reacquires the lock. It reports whether it was notified.
func (cv *Condition) Wait(ctx context.Context) (bool, error) {
	res, err := cv.call(ctx, "wait", nil, append([]any{"tid", cv.tid}, timeoutArgs(ctx)...)...)
	return res == true, err
}

// Notify wakes up to n waiters; the caller must hold the lock.
func (cv *Condition) Notify(ctx context.Context, n int) error {
	_, err := cv.call(ctx, "notify", nil, "tid", cv.tid, "n", n)
	return err
}

// NotifyAll wakes every waiter; the caller must hold the lock.
func (cv *Condition) NotifyAll(ctx context.Context) error {
	_, err := cv.call(ctx, "notify_all", nil, "tid", cv.tid)
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
	h, err := c.create(ctx, "barrier", name, "parties", parties, "action", action != nil)
	return &Barrier{Handle: h, action: action}, err
}

// Wait waits for all parties and returns this party's index.
func (b *Barrier) Wait(ctx context.Context) (int, error) {
	res, err := b.call(ctx, "wait", nil, timeoutArgs(ctx)...)
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
		if _, err := b.call(ctx, "action_done", nil, "ok", aerr == nil); err != nil {
			return idx, err
		}
		if aerr != nil {
			return idx, fmt.Errorf("barrier action: %w", aerr)
		}
	}
	return idx, nil
}

// Abort breaks the barrier.
func (b *Barrier) Abort(ctx context.Context) error { _, err := b.call(ctx, "abort", nil); return err }

// Reset returns the barrier to its initial state.
func (b *Barrier) Reset(ctx context.Context) error { _, err := b.call(ctx, "reset", nil); return err }

// Broken reports whether the barrier is broken.
func (b *Barrier) Broken(ctx context.Context) (bool, error) {
	res, err := b.call(ctx, "broken", nil)
	return res == true, err
}

// JoinableQueue is a Queue with task_done and join.
type JoinableQueue struct{ Queue }

// JoinableQueue returns the named JoinableQueue.
func (c *Client) JoinableQueue(ctx context.Context, name string, maxsize int) (*JoinableQueue, error) {
	h, err := c.create(ctx, "joinable_queue", name, "maxsize", maxsize)
	return &JoinableQueue{Queue{h}}, err
}

// TaskDone marks one got item as processed.
func (q *JoinableQueue) TaskDone(ctx context.Context) error {
	_, err := q.call(ctx, "task_done", nil)
	return err
}

// Join waits until every item put has been marked done, or ctx ends.
func (q *JoinableQueue) Join(ctx context.Context) error {
	res, err := q.call(ctx, "join", nil, timeoutArgs(ctx)...)
	if err == nil && res != true {
		return context.DeadlineExceeded
	}
	return err
}

// Dict is a shared map from byte-string keys to byte-string values. (The
// Python client layers pickled keys and values on the same object.)
type Dict struct{ Handle }

// Dict returns the named dict.
func (c *Client) Dict(ctx context.Context, name string) (*Dict, error) {
	h, err := c.create(ctx, "dict", name)
	return &Dict{h}, err
}

// Get returns the value for key; an error with code key_error if absent.
func (d *Dict) Get(ctx context.Context, key []byte) ([]byte, error) {
	res, err := d.call(ctx, "get", nil, "key", key)
	b, _ := res.([]byte)
	return b, err
}

// Set stores value under key.
func (d *Dict) Set(ctx context.Context, key, value []byte) error {
	_, err := d.call(ctx, "set", nil, "key", key, "kp", key, "value", value)
	return err
}

// Delete removes key.
func (d *Dict) Delete(ctx context.Context, key []byte) error {
	_, err := d.call(ctx, "del", nil, "key", key)
	return err
}

// Update stores several entries atomically.
func (d *Dict) Update(ctx context.Context, entries map[string][]byte) error {
	triples := make([][][]byte, 0, len(entries))
	for k, v := range entries {
		triples = append(triples, [][]byte{[]byte(k), []byte(k), v})
	}
	raw, err := msgpack.Marshal(triples)
	if err != nil {
		return err
	}
	_, err = d.call(ctx, "update", nil, "items", raw)
	return err
}

// Len returns the number of entries.
func (d *Dict) Len(ctx context.Context) (int, error) {
	res, err := d.call(ctx, "len", nil)
	n, _ := toInt(res)
	return n, err
}

// List is a shared list of byte strings.
type List struct{ Handle }

// List returns the named list.
func (c *Client) List(ctx context.Context, name string) (*List, error) {
	h, err := c.create(ctx, "list", name)
	return &List{h}, err
}

// Append adds an item at the end.
func (l *List) Append(ctx context.Context, v []byte) error {
	_, err := l.call(ctx, "append", nil, "value", v)
	return err
}

// Get returns item i (negative counts from the end).
func (l *List) Get(ctx context.Context, i int) ([]byte, error) {
	res, err := l.call(ctx, "getitem", nil, "index", i)
	b, _ := res.([]byte)
	return b, err
}

// Len returns the number of items.
func (l *List) Len(ctx context.Context) (int, error) {
	res, err := l.call(ctx, "len", nil)
	n, _ := toInt(res)
	return n, err
}
