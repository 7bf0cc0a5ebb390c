package server

import (
	"context"
	"time"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// syncOps: Lock, RLock, Semaphore, BoundedSemaphore, Condition, Event,
// Barrier and Value.
func syncOps(t *opTable) {
	const f = "sync"
	t.objectOp(f, acquirerKinds, wire.OpAcquire, nil, opAcquire)
	t.objectOp(f, acquirerKinds, wire.OpRelease, opRelease, nil)

	cond := []string{wire.KindCondition}
	t.objectOp(f, cond, wire.OpWait, nil, opCondWait)
	t.objectOp(f, cond, wire.OpNotify, withObj(func(c *conn, cv *manager.Condition, a wire.Args) (any, error) {
		tid, err := a.Int(wire.ArgTID, 0)
		if err != nil {
			return nil, err
		}
		n, err := a.Int(wire.ArgN, 1)
		if err != nil {
			return nil, err
		}
		return nil, cv.Notify(c.sess, tid, int(n))
	}), nil)
	t.objectOp(f, cond, wire.OpNotifyAll, withObj(func(c *conn, cv *manager.Condition, a wire.Args) (any, error) {
		tid, err := a.Int(wire.ArgTID, 0)
		if err != nil {
			return nil, err
		}
		return nil, cv.NotifyAll(c.sess, tid)
	}), nil)

	event := []string{wire.KindEvent}
	t.objectOp(f, event, wire.OpIsSet, withObj(func(c *conn, e *manager.Event, a wire.Args) (any, error) { return e.IsSet(), nil }), nil)
	t.objectOp(f, event, wire.OpSet, withObj(func(c *conn, e *manager.Event, a wire.Args) (any, error) { e.Set(); return nil, nil }), nil)
	t.objectOp(f, event, wire.OpClear, withObj(func(c *conn, e *manager.Event, a wire.Args) (any, error) { e.Clear(); return nil, nil }), nil)
	t.objectOp(f, event, wire.OpWait, nil, opEventWait)

	barrier := []string{wire.KindBarrier}
	t.objectOp(f, barrier, wire.OpWait, nil, opBarrierWait)
	t.objectOp(f, barrier, wire.OpActionDone, withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) {
		ok, err := a.Bool(wire.ArgOK, true)
		if err != nil {
			return nil, err
		}
		return nil, b.ActionDone(c.sess, ok)
	}), nil)
	t.objectOp(f, barrier, wire.OpAbort, withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { b.Abort(); return nil, nil }), nil)
	t.objectOp(f, barrier, wire.OpReset, withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { b.Reset(); return nil, nil }), nil)
	t.objectOp(f, barrier, wire.OpParties, withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { return b.Parties(), nil }), nil)
	t.objectOp(f, barrier, wire.OpNWaiting, withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { return b.NWaiting(), nil }), nil)
	t.objectOp(f, barrier, wire.OpBroken, withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { return b.Broken(), nil }), nil)

	value := []string{wire.KindValue}
	t.objectOp(f, value, wire.OpGet, withObj(func(c *conn, v *manager.Value, a wire.Args) (any, error) { return v.Get(), nil }), nil)
	t.objectOp(f, value, wire.OpSet, withObj(func(c *conn, v *manager.Value, a wire.Args) (any, error) { return nil, v.Set(a.Get(wire.ArgValue)) }), nil)
	t.objectOp(f, value, wire.OpAdd, withObj(func(c *conn, v *manager.Value, a wire.Args) (any, error) { return v.Add(a.Get(wire.ArgDelta)) }), nil)
	t.objectOp(f, value, wire.OpCAS, withObj(func(c *conn, v *manager.Value, a wire.Args) (any, error) {
		return v.CompareAndSet(a.Get(wire.ArgExpected), a.Get(wire.ArgNew))
	}), nil)
}

// acquirer is implemented by Lock, RLock, Semaphore and Condition.
type acquirer interface {
	AcquireGrant(ctx context.Context, s *manager.Session, tid int64, block bool, timeout time.Duration) (manager.Grant, error)
	Release(s *manager.Session, tid int64) error
}

func opAcquire(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	l, err := lookup[acquirer](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	tid, err := a.Int(wire.ArgTID, 0)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	block, timeout, err := blocking(a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	g, err := l.AcquireGrant(c.ctx, c.sess, tid, false, 0)
	if g.OK() || err != nil || !block || timeout == 0 {
		return g.OK(), g, err
	}
	return nil, manager.Grant{}, c.park(id, func(ctx context.Context) (any, manager.Grant, error) {
		g, err := l.AcquireGrant(ctx, c.sess, tid, true, timeout)
		return g.OK(), g, err
	})
}

func opRelease(c *conn, _ uint64, a wire.Args) (any, error) {
	l, err := lookup[acquirer](c, a)
	if err != nil {
		return nil, err
	}
	tid, err := a.Int(wire.ArgTID, 0)
	if err != nil {
		return nil, err
	}
	return nil, l.Release(c.sess, tid)
}

func opEventWait(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	e, err := lookup[*manager.Event](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	_, timeout, err := blocking(a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	since, err := a.Int(wire.ArgSince, manager.NoSince)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	if since < manager.NoSince {
		return nil, manager.Grant{}, wire.Errorf(wire.CodeBadRequest, "since must be a generation (>= 0)")
	}
	if set := e.SetSince(since); set || timeout == 0 {
		return set, manager.Grant{}, nil
	}
	return nil, manager.Grant{}, c.park(id, func(ctx context.Context) (any, manager.Grant, error) {
		g, err := e.WaitGrant(ctx, timeout, since)
		return g.OK(), g, err
	})
}

func opCondWait(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	cv, err := lookup[*manager.Condition](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	tid, err := a.Int(wire.ArgTID, 0)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	_, timeout, err := blocking(a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	return nil, manager.Grant{}, c.park(id, func(ctx context.Context) (any, manager.Grant, error) {
		g, err := cv.WaitGrant(ctx, c.sess, tid, timeout)
		return g.OK(), g, err
	})
}

func opBarrierWait(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	b, err := lookup[*manager.Barrier](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	_, timeout, err := blocking(a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	return nil, manager.Grant{}, c.park(id, func(ctx context.Context) (any, manager.Grant, error) {
		g, err := b.WaitGrant(ctx, c.sess, timeout)
		if err != nil {
			return nil, g, err
		}
		return map[string]any{"index": g.Index(), "action": g.RunAction()}, g, nil
	})
}
