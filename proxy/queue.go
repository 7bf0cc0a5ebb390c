package proxy

import (
	"context"

	"github.com/syncmgr/syncmgr/wire"
)

// Handles of the queue family: Queue and JoinableQueue.

// Queue is a shared FIFO. Items are values in the encoding both clients
// share (see EncodeValue): a Python process gets what a Go process put.
type Queue struct{ Handle }

// Queue returns the named Queue (maxsize <= 0: unbounded).
func (c *Client) Queue(ctx context.Context, name string, maxsize int) (*Queue, error) {
	h, err := c.create(ctx, wire.KindQueue, name, wire.ArgMaxSize, maxsize)
	return &Queue{h}, err
}

// Put appends item (encoded with EncodeValue), waiting for room until ctx ends.
func (q *Queue) Put(ctx context.Context, item any) error {
	b, err := EncodeValue(item)
	if err != nil {
		return err
	}
	if q.qr != nil {
		if done, err := q.fastPut(ctx, b, true); done {
			return err
		}
	}
	_, err = q.call(ctx, wire.OpPut, nil, append([]any{wire.ArgItem, b}, timeoutArgs(ctx)...)...)
	return err
}

// TryPut appends without waiting; ErrFull when there is no room.
func (q *Queue) TryPut(ctx context.Context, item any) error {
	b, err := EncodeValue(item)
	if err != nil {
		return err
	}
	if q.qr != nil {
		if done, err := q.fastPut(ctx, b, false); done {
			return err
		}
	}
	_, err = q.call(ctx, wire.OpPut, nil, wire.ArgItem, b, wire.ArgBlock, false)
	return err
}

// Get removes the first item, waiting until ctx ends (ErrEmpty on a
// deadline), and returns it decoded (see DecodeValue).
func (q *Queue) Get(ctx context.Context) (any, error) {
	if q.qr != nil {
		if done, v, err := q.fastGet(ctx, true); done {
			return v, err
		}
	}
	res, err := q.call(ctx, wire.OpGet, q.undoGet, timeoutArgs(ctx)...)
	return q.decode(res, err)
}

// TryGet removes the first item without waiting; ErrEmpty when none.
func (q *Queue) TryGet(ctx context.Context) (any, error) {
	if q.qr != nil {
		if done, v, err := q.fastGet(ctx, false); done {
			return v, err
		}
	}
	res, err := q.call(ctx, wire.OpGet, q.undoGet, wire.ArgBlock, false)
	return q.decode(res, err)
}

// PutMany appends items, all together (adjacent and in order) or none,
// in one request, waiting for room for all of them until ctx ends (ErrFull
// on a deadline). A batch larger than the queue's maxsize fails at once
// with a wire.CodeValueError error. It goes through the daemon also when
// the queue is on the fast path: the daemon serves the ring under its
// latch, so the FIFO stays one.
func (q *Queue) PutMany(ctx context.Context, items []any) error {
	return q.putMany(ctx, items, timeoutArgs(ctx))
}

// TryPutMany is PutMany without waiting: ErrFull when the batch does not
// fit now.
func (q *Queue) TryPutMany(ctx context.Context, items []any) error {
	return q.putMany(ctx, items, []any{wire.ArgBlock, false})
}

func (q *Queue) putMany(ctx context.Context, items []any, wait []any) error {
	bins := make([][]byte, len(items))
	for i, it := range items {
		b, err := EncodeValue(it)
		if err != nil {
			return err // nothing sent
		}
		bins[i] = b
	}
	if len(bins) == 0 {
		return nil
	}
	raw, err := wire.Marshal(bins)
	if err != nil {
		return err
	}
	_, err = q.call(ctx, wire.OpPutMany, nil, append([]any{wire.ArgItems, raw}, wait...)...)
	return err
}

// GetMany removes the first item, waiting for one until ctx ends (ErrEmpty
// on a deadline), then as many more as the queue holds at once, up to max,
// in one request; the items come decoded, in order. If any does not decode
// they all go back to the front of the queue and the error costs nothing.
func (q *Queue) GetMany(ctx context.Context, max int) ([]any, error) {
	return q.getMany(ctx, max, timeoutArgs(ctx))
}

// TryGetMany is GetMany without waiting: ErrEmpty when the queue is empty.
func (q *Queue) TryGetMany(ctx context.Context, max int) ([]any, error) {
	return q.getMany(ctx, max, []any{wire.ArgBlock, false})
}

func (q *Queue) getMany(ctx context.Context, max int, wait []any) ([]any, error) {
	if max < 1 {
		return nil, wire.Errorf(wire.CodeValueError, "GetMany takes at least 1 item, not %d", max)
	}
	res, err := q.call(ctx, wire.OpGetMany, q.undoGetMany, append([]any{wire.ArgN, max}, wait...)...)
	if err != nil {
		return nil, err
	}
	raw, _ := res.([]any)
	out := make([]any, len(raw))
	for i, r := range raw {
		b, _ := r.([]byte)
		v, err := DecodeValue(b)
		if err != nil {
			q.undoGetMany(res)
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// undoGetMany puts a get_many's items back at the front, in order.
func (q *Queue) undoGetMany(res any) {
	raw, _ := res.([]any)
	for i := len(raw) - 1; i >= 0; i-- {
		q.undoGet(raw[i])
	}
}

// decode decodes a got item; an item that does not decode goes back to the
// front of the queue, so that the error costs nothing.
func (q *Queue) decode(res any, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	b, _ := res.([]byte)
	v, err := DecodeValue(b)
	if err != nil {
		q.undoGet(res)
		return nil, err
	}
	return v, nil
}

func (q *Queue) undoGet(res any) {
	if b, ok := res.([]byte); ok {
		_ = q.c.Notify(wire.OpUnget, q.args(wire.ArgItem, b))
	}
}

// Len returns the number of items.
func (q *Queue) Len(ctx context.Context) (int, error) {
	if q.qr != nil && q.alive() {
		if n, ok := q.qr.Len(); ok {
			return n, nil
		}
	}
	res, err := q.call(ctx, wire.OpQsize, nil)
	n, _ := toInt(res)
	return n, err
}

// JoinableQueue is a Queue with task_done and join.
type JoinableQueue struct{ Queue }

// JoinableQueue returns the named JoinableQueue.
func (c *Client) JoinableQueue(ctx context.Context, name string, maxsize int) (*JoinableQueue, error) {
	h, err := c.create(ctx, wire.KindJoinableQueue, name, wire.ArgMaxSize, maxsize)
	return &JoinableQueue{Queue{h}}, err
}

// TaskDone marks one got item as processed; called more times than items
// were put, it answers a wire.CodeValueError error and changes nothing.
func (q *JoinableQueue) TaskDone(ctx context.Context) error {
	if q.qr != nil {
		if done, err := q.fastTaskDone(ctx); done {
			return err
		}
	}
	_, err := q.call(ctx, wire.OpTaskDone, nil)
	return err
}

// Join waits until every item put has been marked done, or ctx ends
// (context.DeadlineExceeded on a deadline, ctx's error on a cancel).
func (q *JoinableQueue) Join(ctx context.Context) error {
	if q.qr != nil {
		if done, err := q.fastJoin(ctx); done {
			return err
		}
	}
	res, err := q.call(ctx, wire.OpJoin, nil, timeoutArgs(ctx)...)
	if err == nil && res != true {
		return context.DeadlineExceeded
	}
	return err
}
