package server

import (
	"context"
	"runtime"
	"time"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// handler executes one request. It returns errParked when it has arranged
// to reply later.
type handler func(c *conn, id uint64, a wire.Args) (any, error)

// serverOps are the ops that do not address one object.
var serverOps = map[string]handler{
	"ping":   func(*conn, uint64, wire.Args) (any, error) { return nil, nil },
	"create": opCreate,
	"delete": func(c *conn, _ uint64, a wire.Args) (any, error) {
		name, err := a.String("name")
		if err != nil {
			return nil, err
		}
		return c.srv.mgr.Delete(name), nil
	},
	"incref": refOp((*manager.Manager).Incref),
	"decref": refOp((*manager.Manager).Decref),
	"share": func(c *conn, _ uint64, a wire.Args) (any, error) {
		name, err := a.String("name")
		if err != nil {
			return nil, err
		}
		return nil, c.srv.mgr.Share(name)
	},
	"cancel": func(c *conn, _ uint64, a wire.Args) (any, error) {
		id, err := a.Uint("id", 0)
		if err != nil {
			return nil, err
		}
		c.cancelParked(id)
		return nil, nil
	},
	"status": opStatus,
}

// objectOps are the ops of each kind, keyed by kind then op.
var objectOps = map[manager.Kind]map[string]handler{}

func init() {
	acq := map[string]handler{"acquire": opAcquire, "release": opRelease}
	for _, k := range []manager.Kind{manager.KindLock, manager.KindRLock, manager.KindSemaphore, manager.KindBoundedSemaphore} {
		objectOps[k] = acq
	}
	objectOps[manager.KindEvent] = map[string]handler{
		"is_set": eventOp(func(e *manager.Event) any { return e.IsSet() }),
		"set":    eventOp(func(e *manager.Event) any { e.Set(); return nil }),
		"clear":  eventOp(func(e *manager.Event) any { e.Clear(); return nil }),
		"wait":   opEventWait,
	}
	objectOps[manager.KindValue] = map[string]handler{
		"get": withObj(func(c *conn, v *manager.Value, a wire.Args) (any, error) { return v.Get(), nil }),
		"set": withObj(func(c *conn, v *manager.Value, a wire.Args) (any, error) { return nil, v.Set(a["value"]) }),
		"add": withObj(func(c *conn, v *manager.Value, a wire.Args) (any, error) { return v.Add(a["delta"]) }),
		"cas": withObj(func(c *conn, v *manager.Value, a wire.Args) (any, error) {
			return v.CompareAndSet(a["expected"], a["new"])
		}),
	}
	objectOps[manager.KindQueue] = map[string]handler{
		"put": opPut,
		"get": opGet,
		"unget": withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) {
			item, err := a.Bytes("item")
			if err != nil {
				return nil, err
			}
			return nil, q.Unget(item)
		}),
		"qsize": withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return q.Len(), nil }),
		"empty": withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return q.Len() == 0, nil }),
		"full":  withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return q.Full(), nil }),
	}
}

func (c *conn) handle(req *wire.Request) (any, error) {
	if h, ok := serverOps[req.Op]; ok {
		return h(c, req.ID, req.Args)
	}
	kind, err := req.Args.String("kind")
	if err != nil {
		if !isObjectOp(req.Op) {
			return nil, wire.Errorf(wire.CodeUnknownOp, "unknown op %q", req.Op)
		}
		return nil, err
	}
	ops, ok := objectOps[manager.Kind(kind)]
	if !ok {
		return nil, wire.Errorf(wire.CodeBadRequest, "unknown kind %q", kind)
	}
	h, ok := ops[req.Op]
	if !ok {
		return nil, wire.Errorf(wire.CodeUnknownOp, "%q is not an op of a %s", req.Op, kind)
	}
	return h(c, req.ID, req.Args)
}

// isObjectOp reports whether op is an op of some kind, to tell an unknown
// op from a missing kind.
func isObjectOp(op string) bool {
	for _, ops := range objectOps {
		if _, ok := ops[op]; ok {
			return true
		}
	}
	return false
}

// lookup finds the object a request names and asserts its Go type.
func lookup[T any](c *conn, a wire.Args) (T, error) {
	var zero T
	kind, err := a.String("kind")
	if err != nil {
		return zero, err
	}
	name, err := a.String("name")
	if err != nil {
		return zero, err
	}
	obj, err := c.srv.mgr.Lookup(manager.Kind(kind), name)
	if err != nil {
		return zero, err
	}
	t, ok := obj.(T)
	if !ok {
		return zero, wire.Errorf(wire.CodeUnknownOp, "op not supported by a %s", kind)
	}
	return t, nil
}

func withObj[T any](fn func(c *conn, obj T, a wire.Args) (any, error)) handler {
	return func(c *conn, _ uint64, a wire.Args) (any, error) {
		obj, err := lookup[T](c, a)
		if err != nil {
			return nil, err
		}
		return fn(c, obj, a)
	}
}

func eventOp(fn func(*manager.Event) any) handler {
	return withObj(func(c *conn, e *manager.Event, a wire.Args) (any, error) { return fn(e), nil })
}

func refOp(fn func(*manager.Manager, *manager.Session, string) error) handler {
	return func(c *conn, _ uint64, a wire.Args) (any, error) {
		name, err := a.String("name")
		if err != nil {
			return nil, err
		}
		return nil, fn(c.srv.mgr, c.sess, name)
	}
}

func opCreate(c *conn, _ uint64, a wire.Args) (any, error) {
	kind, err := a.String("kind")
	if err != nil {
		return nil, err
	}
	name, err := a.OptString("name")
	if err != nil {
		return nil, err
	}
	if v, given := a["name"]; given && v == "" {
		return nil, manager.ValidateName("") // an empty name is a bad name, not a request for an anonymous object
	}
	var p manager.Params
	switch manager.Kind(kind) {
	case manager.KindSemaphore, manager.KindBoundedSemaphore:
		if p.Value, err = a.Int("value", 1); err != nil {
			return nil, err
		}
	case manager.KindValue:
		if p.Typecode, err = a.String("typecode"); err != nil {
			return nil, err
		}
		p.Initial = a["value"]
	case manager.KindQueue, manager.KindJoinableQueue:
		if p.MaxSize, err = a.Int("maxsize", 0); err != nil {
			return nil, err
		}
	case manager.KindCondition:
		if p.Lock, err = a.OptString("lock"); err != nil {
			return nil, err
		}
	case manager.KindBarrier:
		if p.Parties, err = a.Int("parties", 0); err != nil {
			return nil, err
		}
		if p.Action, err = a.Bool("action", false); err != nil {
			return nil, err
		}
		if _, p.Timeout, err = blocking(a); err != nil {
			return nil, err
		}
	}
	obj, created, err := c.srv.mgr.Create(c.sess, manager.Kind(kind), name, p)
	if err != nil {
		return nil, err
	}
	return map[string]any{"name": obj.Name(), "created": created}, nil
}

func opStatus(c *conn, _ uint64, a wire.Args) (any, error) {
	limit, err := a.Int("limit", 10000)
	if err != nil {
		return nil, err
	}
	objs, sess := c.srv.mgr.Snapshot(int(limit))
	nobj, nsess := c.srv.mgr.Count()
	st := Stats{Version: Version, PID: osPID, Uptime: time.Since(c.srv.start).Seconds(),
		Connections: c.srv.authed.Load(), Handshaking: c.srv.unauth.Load(), Objects: nobj, Sessions: nsess,
		BootID: c.srv.bootID, MaxFrame: c.srv.cfg.MaxFrame, ObjectsListed: len(objs), ObjectsOmmitted: nobj - len(objs),
		Goroutines: runtime.NumGoroutine(), RSS: RSS()}
	return map[string]any{"server": st, "objects": objs, "sessions": sess}, nil
}

// blocking reads the block and timeout arguments.
func blocking(a wire.Args) (block bool, timeout time.Duration, err error) {
	if block, err = a.Bool("block", true); err != nil {
		return
	}
	secs, ok, err := a.Timeout()
	if err != nil {
		return
	}
	timeout = manager.Forever
	if ok && secs < 1e9 {
		timeout = time.Duration(secs * float64(time.Second))
	}
	return
}

// acquirer is implemented by Lock, RLock and Semaphore.
type acquirer interface {
	Acquire(ctx context.Context, s *manager.Session, tid int64, block bool, timeout time.Duration) (bool, error)
	Release(s *manager.Session, tid int64) error
}

func opAcquire(c *conn, id uint64, a wire.Args) (any, error) {
	l, err := lookup[acquirer](c, a)
	if err != nil {
		return nil, err
	}
	tid, err := a.Int("tid", 0)
	if err != nil {
		return nil, err
	}
	block, timeout, err := blocking(a)
	if err != nil {
		return nil, err
	}
	ok, err := l.Acquire(c.ctx, c.sess, tid, false, 0)
	if ok || err != nil || !block || timeout == 0 {
		return ok, err
	}
	return nil, c.park(id, func(ctx context.Context) (any, error) {
		return l.Acquire(ctx, c.sess, tid, true, timeout)
	}, func(res any) {
		if res == true {
			_ = l.Release(c.sess, tid)
		}
	})
}

func opRelease(c *conn, _ uint64, a wire.Args) (any, error) {
	l, err := lookup[acquirer](c, a)
	if err != nil {
		return nil, err
	}
	tid, err := a.Int("tid", 0)
	if err != nil {
		return nil, err
	}
	return nil, l.Release(c.sess, tid)
}

func opEventWait(c *conn, id uint64, a wire.Args) (any, error) {
	e, err := lookup[*manager.Event](c, a)
	if err != nil {
		return nil, err
	}
	_, timeout, err := blocking(a)
	if err != nil {
		return nil, err
	}
	if e.IsSet() || timeout == 0 {
		return e.IsSet(), nil
	}
	return nil, c.park(id, func(ctx context.Context) (any, error) { return e.Wait(ctx, timeout) }, nil)
}

func opPut(c *conn, id uint64, a wire.Args) (any, error) {
	q, err := lookup[*manager.Queue](c, a)
	if err != nil {
		return nil, err
	}
	item, err := a.Bytes("item")
	if err != nil {
		return nil, err
	}
	block, timeout, err := blocking(a)
	if err != nil {
		return nil, err
	}
	err = q.Put(c.ctx, item, false, 0)
	if err != manager.ErrFull || !block || timeout == 0 {
		return nil, err
	}
	return nil, c.park(id, func(ctx context.Context) (any, error) { return nil, q.Put(ctx, item, true, timeout) }, nil)
}

func opGet(c *conn, id uint64, a wire.Args) (any, error) {
	q, err := lookup[*manager.Queue](c, a)
	if err != nil {
		return nil, err
	}
	block, timeout, err := blocking(a)
	if err != nil {
		return nil, err
	}
	item, err := q.Get(c.ctx, false, 0)
	if err != manager.ErrEmpty || !block || timeout == 0 {
		return item, err
	}
	return nil, c.park(id, func(ctx context.Context) (any, error) { return q.Get(ctx, true, timeout) }, func(res any) {
		_ = q.Unget(res.([]byte))
	})
}
