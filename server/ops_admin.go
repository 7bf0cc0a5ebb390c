package server

import (
	"runtime"
	"time"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// adminOps: the ops that address no object (the registry, cancellation,
// status).
func adminOps(t *opTable) {
	const f = "admin"
	t.serverOp(f, wire.OpPing, func(*conn, uint64, wire.Args) (any, error) { return nil, nil })
	t.serverOp(f, wire.OpCreate, opCreate)
	t.serverOp(f, wire.OpDelete, func(c *conn, _ uint64, a wire.Args) (any, error) {
		name, err := a.String(wire.ArgName)
		if err != nil {
			return nil, err
		}
		return c.srv.mgr.Delete(name), nil
	})
	t.serverOp(f, wire.OpIncref, refOp((*manager.Manager).Incref))
	t.serverOp(f, wire.OpDecref, refOp((*manager.Manager).Decref))
	t.serverOp(f, wire.OpShare, func(c *conn, _ uint64, a wire.Args) (any, error) {
		name, err := a.String(wire.ArgName)
		if err != nil {
			return nil, err
		}
		return nil, c.srv.mgr.Share(name)
	})
	t.serverOp(f, wire.OpCancel, func(c *conn, _ uint64, a wire.Args) (any, error) {
		id, err := a.Uint(wire.ArgID, 0)
		if err != nil {
			return nil, err
		}
		c.cancelParked(id)
		return nil, nil
	})
	t.serverOp(f, wire.OpStatus, opStatus)
}

func refOp(fn func(*manager.Manager, *manager.Session, string) error) handler {
	return func(c *conn, _ uint64, a wire.Args) (any, error) {
		name, err := a.String(wire.ArgName)
		if err != nil {
			return nil, err
		}
		return nil, fn(c.srv.mgr, c.sess, name)
	}
}

func opCreate(c *conn, _ uint64, a wire.Args) (any, error) {
	kind, err := a.String(wire.ArgKind)
	if err != nil {
		return nil, err
	}
	name, err := a.OptString(wire.ArgName)
	if err != nil {
		return nil, err
	}
	if v, given := a[wire.ArgName]; given && v == "" {
		return nil, manager.ValidateName("") // an empty name is a bad name, not a request for an anonymous object
	}
	var p manager.Params
	switch manager.Kind(kind) {
	case manager.KindSemaphore, manager.KindBoundedSemaphore:
		if p.Value, err = a.Int(wire.ArgValue, 1); err != nil {
			return nil, err
		}
	case manager.KindValue:
		if p.Typecode, err = a.String(wire.ArgTypecode); err != nil {
			return nil, err
		}
		p.Initial = a[wire.ArgValue]
	case manager.KindQueue, manager.KindJoinableQueue:
		if p.MaxSize, err = a.Int(wire.ArgMaxSize, 0); err != nil {
			return nil, err
		}
	case manager.KindCondition:
		if p.Lock, err = a.OptString(wire.ArgLock); err != nil {
			return nil, err
		}
	case manager.KindBarrier:
		if p.Parties, err = a.Int(wire.ArgParties, 0); err != nil {
			return nil, err
		}
		if p.Action, err = a.Bool(wire.ArgAction, false); err != nil {
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
	res := &createReply{Name: obj.Name(), Created: created}
	// A fast-path client gets the object's word with the reply: one round
	// trip to make a fast-path object, not two (create, then fastpath_ref).
	if fp, _ := a.Bool(wire.ArgFastpath, false); fp && c.fastpathAllowed() == nil {
		if ref, ok := c.srv.mgr.FastRef(obj); ok {
			res.FP = fastRefReply(c, ref)
		}
	}
	return res, nil
}

// createReply is create's answer: the object's name, whether this call
// made it, and for a fast-path client its word (a struct, not a map: half
// the encoding time of the reply every create sends).
type createReply struct {
	Name    string    `msgpack:"name"`
	Created bool      `msgpack:"created"`
	FP      *fastWord `msgpack:"fp,omitempty"`
}

func opStatus(c *conn, _ uint64, a wire.Args) (any, error) {
	limit, err := a.Int(wire.ArgLimit, 10000)
	if err != nil {
		return nil, err
	}
	objs, sess := c.srv.mgr.Snapshot(int(limit))
	nobj, nsess := c.srv.mgr.Count()
	st := Stats{Version: Version, PID: osPID, Uptime: time.Since(c.srv.start).Seconds(),
		Connections: c.srv.authed.Load(), Handshaking: int64(c.srv.adm.pendingCount()), Objects: nobj, Sessions: nsess,
		BootID: c.srv.bootID, RunID: c.srv.runID, MaxFrame: c.srv.cfg.MaxFrame, ObjectsListed: len(objs), ObjectsOmmitted: nobj - len(objs),
		Goroutines: runtime.NumGoroutine(), RSS: RSS()}
	return map[string]any{"server": st, "objects": objs, "sessions": sess, "waiting": c.srv.waiting()}, nil
}
