package manager

import (
	"context"
	"fmt"
	"time"
)

// Batches: put_many and get_many, each one op.
//
// A put_many is atomic: all its items go in, adjacent and in order, or none
// does (an error, a full queue at the deadline, a cancelled wait). A batch
// of more items than maxsize can never fit and fails at once with ErrValue.
// A waiting batch is one putter: it goes in when there is room for all of
// it, and the putters behind it wait their turn, as behind any putter.
//
// A get_many takes at least one item (waiting as get does), then as many
// more as the queue holds at once, up to its count and its byte budget (the
// reply must fit one frame). Its grant takes every item back, in order, when
// the reply is not delivered.

// PutManyGrant appends items, all of them or none, waiting for room for
// all when the queue is full. It fails with ErrFull when there is no room
// in time (or at once with block false), and with ErrValue when the batch
// is larger than maxsize. As a put's, its grant has nothing to undo.
func (q *Queue) PutManyGrant(ctx context.Context, items [][]byte, block bool, timeout time.Duration) (Grant, error) {
	if len(items) == 0 {
		return Grant{ok: true}, nil
	}
	if q.maxsize > 0 && int64(len(items)) > q.maxsize {
		return Grant{}, fmt.Errorf("%w: a batch of %d items can never fit a queue of maxsize %d (put it in batches of at most %d)", ErrValue, len(items), q.maxsize, q.maxsize)
	}
	if err := q.put(ctx, nil, items, block, timeout); err != nil {
		return Grant{}, err
	}
	return Grant{ok: true}, nil
}

// batchItemFraming is what GetManyGrant counts for each item on top of its
// bytes (a reply's bin header is at most 5).
const batchItemFraming = 8

// GetManyGrant removes the first item, waiting for one as GetGrant does,
// then as many more as the queue holds now, up to max items and maxBytes
// bytes in all, each counted with batchItemFraming (the first item is taken
// whatever its size). Undoing the
// grant puts every item back at the front, in order.
func (q *Queue) GetManyGrant(ctx context.Context, max int, maxBytes int64, block bool, timeout time.Duration) (Grant, error) {
	if max < 1 {
		return Grant{}, fmt.Errorf("%w: get_many takes at least 1 item", ErrValue)
	}
	first, err := q.get(ctx, block, timeout)
	if err != nil {
		return Grant{}, err
	}
	// Room for a producer's batch of 64 is made at once, not by growing
	// the slice.
	items := make([][]byte, 1, min(max, 64))
	items[0] = first
	if max > 1 {
		// The rest in one go under q.mu: a ring moves items the daemon holds
		// into shared memory once, after the batch, not between its items
		// (each of which would then be copied back out).
		q.mu.Lock()
		if q.dead == nil {
			// (an error leaves the items taken the caller's)
			items, _ = q.store.tryGetMany(items, max-1, maxBytes-int64(len(first))-batchItemFraming)
		}
		q.mu.Unlock()
	}
	return Grant{obj: q, items: items, ok: true}, nil
}
