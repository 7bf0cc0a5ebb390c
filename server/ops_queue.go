package server

import (
	"context"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// queueFamily names the queue ops' family (which leave an event loop
// while their queue is busy: evloop_offloop.go).
const queueFamily = "queue"

// queueOps: Queue and JoinableQueue.
func queueOps(t *opTable) {
	const f = queueFamily
	t.objectOp(f, queueKinds, wire.OpPut, nil, opPut)
	t.objectOp(f, queueKinds, wire.OpGet, nil, opGet)
	t.objectOp(f, queueKinds, wire.OpPutMany, nil, opPutMany)
	t.objectOp(f, queueKinds, wire.OpGetMany, nil, opGetMany)
	t.objectOp(f, queueKinds, wire.OpUnget, withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) {
		item, err := a.Bytes(wire.ArgItem)
		if err != nil {
			return nil, err
		}
		return nil, q.UngetBy(item, c.sess)
	}), nil)
	t.objectOp(f, queueKinds, wire.OpQsize, withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return q.Len(), nil }), nil)
	t.objectOp(f, queueKinds, wire.OpEmpty, withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return q.Len() == 0, nil }), nil)
	t.objectOp(f, queueKinds, wire.OpFull, withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return q.Full(), nil }), nil)

	jq := []string{wire.KindJoinableQueue}
	t.objectOp(f, jq, wire.OpTaskDone, withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return nil, q.TaskDoneBy(c.sess) }), nil)
	t.objectOp(f, jq, wire.OpUnfinished, withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return q.Unfinished(), nil }), nil)
	t.objectOp(f, jq, wire.OpJoin, nil, opJoin)
	t.objectOp(f, queueKinds, wire.OpQueueAttach, nil, opQueueAttach)
}

func opPut(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	q, err := lookup[*manager.Queue](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	item, err := a.Bytes(wire.ArgItem)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	block, timeout, err := blocking(a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	g, err := q.PutGrant(c.ctx, item, false, 0)
	if err != manager.ErrFull || !block || timeout == 0 {
		return nil, g, err
	}
	return nil, manager.Grant{}, c.park(id, func(ctx context.Context) (any, manager.Grant, error) {
		g, err := q.PutGrant(ctx, item, true, timeout)
		return nil, g, err
	})
}

func opGet(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	q, err := lookup[*manager.Queue](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	block, timeout, err := blocking(a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	g, err := q.GetGrant(c.ctx, false, 0)
	if err != manager.ErrEmpty || !block || timeout == 0 {
		q.Owe(&g, c.sess)
		return g.Item(), g, err
	}
	return nil, manager.Grant{}, c.park(id, func(ctx context.Context) (any, manager.Grant, error) {
		g, err := q.GetGrant(ctx, true, timeout)
		q.Owe(&g, c.sess)
		return g.Item(), g, err
	})
}

func opJoin(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	q, err := lookup[*manager.Queue](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	_, timeout, err := blocking(a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	if q.Unfinished() == 0 || timeout == 0 {
		ok, err := q.Join(c.ctx, 0)
		return ok, manager.Grant{}, err
	}
	return nil, manager.Grant{}, c.park(id, func(ctx context.Context) (any, manager.Grant, error) {
		ok, err := q.Join(ctx, timeout)
		return ok, manager.Grant{}, err
	})
}

// opPutMany: ArgItems is a msgpack array of bins, stored all together or
// not at all (manager.Queue.PutManyGrant).
func opPutMany(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	q, err := lookup[*manager.Queue](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	raw, err := a.Bytes(wire.ArgItems)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	items, err := wire.BinTuples(raw, 1)
	if err != nil {
		return nil, manager.Grant{}, wire.Errorf(wire.CodeBadRequest, "items must be a msgpack array of bins: %v", err)
	}
	// The items are views of the request's frame. The queue copies one out
	// of it only if it keeps that item's slice and the item is small or
	// under half the batch (manager.ownItem): most go into a ring, a copy
	// already, or straight to a getter.
	block, timeout, err := blocking(a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	g, err := q.PutManyGrant(c.ctx, items, false, 0)
	if err != manager.ErrFull || !block || timeout == 0 {
		return nil, g, err
	}
	return nil, manager.Grant{}, c.park(id, func(ctx context.Context) (any, manager.Grant, error) {
		g, err := q.PutManyGrant(ctx, items, true, timeout)
		return nil, g, err
	})
}

// opGetMany: up to ArgN items (at least one) in one reply, a list of bins
// that fits one frame.
func opGetMany(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	q, err := lookup[*manager.Queue](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	n, err := a.Int(wire.ArgN, 1)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	if n < 1 {
		return nil, manager.Grant{}, wire.Errorf(wire.CodeValueError, "get_many takes at least 1 item, not %d", n)
	}
	block, timeout, err := blocking(a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	max := int(min(n, 1<<20))
	budget := int64(c.srv.cfg.MaxFrame) - 64 // the reply's envelope is under 64 bytes
	if q.HasRing(c.sess.Slot()) {
		// A client with the ring asks only when the ring had nothing for it
		// (or the daemon holds the head): it gets its first item here and
		// takes the rest from shared memory, where the daemon settles what
		// it holds after this batch. Copying them out of the ring into the
		// reply cost the daemon a copy and the socket two per item.
		budget = min(budget, manager.SocketKeepMin)
	}
	reply := func(g manager.Grant) any {
		if items := g.Items(); items != nil {
			return items
		}
		return nil
	}
	g, err := q.GetManyGrant(c.ctx, max, budget, false, 0)
	if err != manager.ErrEmpty || !block || timeout == 0 {
		q.Owe(&g, c.sess)
		return reply(g), g, err
	}
	return nil, manager.Grant{}, c.park(id, func(ctx context.Context) (any, manager.Grant, error) {
		g, err := q.GetManyGrant(ctx, max, budget, true, timeout)
		q.Owe(&g, c.sess)
		return reply(g), g, err
	})
}
