package server

import (
	"context"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// queueOps: Queue and JoinableQueue.
func queueOps(t *opTable) {
	const f = "queue"
	t.objectOp(f, queueKinds, wire.OpPut, nil, opPut)
	t.objectOp(f, queueKinds, wire.OpGet, nil, opGet)
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
