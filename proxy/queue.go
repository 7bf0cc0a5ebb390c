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
