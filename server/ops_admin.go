package server

import (
	"runtime"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/statemem"
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
	if v, given := a.Lookup(wire.ArgName); given && v == "" {
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
		p.Initial = a.Get(wire.ArgValue)
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
	res := &createReply{name: obj.Name(), created: created}
	// A fast-path client gets the object's word with the reply: one round
	// trip to make a fast-path object, not two (create, then fastpath_ref).
	if fp, _ := a.Bool(wire.ArgFastpath, false); fp && c.fastpathAllowed() == nil {
		if ref, ok := c.srv.mgr.FastRef(obj); ok {
			res.fp, res.run = ref, c.srv.runID
		}
	}
	return res, nil
}

// createReply is create's answer, {"name": str, "created": bool}, and for
// a fast-path client "fp": [offset, tag, run], the object's word as
// fastpath_ref gives it, in an array. Encoded by hand: every create sends
// one, and the map fastpath_ref answers, encoded by reflection, cost a
// fast-path create measurably more than the same create without it.
type createReply struct {
	name    string
	created bool
	fp      statemem.Ref
	run     string // "" when there is no word to send
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (r *createReply) EncodeMsgpack(enc *msgpack.Encoder) error {
	n := 2
	if r.run != "" {
		n = 3
	}
	if err := enc.EncodeMapLen(n); err != nil {
		return err
	}
	if err := enc.EncodeString("name"); err != nil {
		return err
	}
	if err := enc.EncodeString(r.name); err != nil {
		return err
	}
	if err := enc.EncodeString("created"); err != nil {
		return err
	}
	if err := enc.EncodeBool(r.created); err != nil {
		return err
	}
	if r.run == "" {
		return nil
	}
	if err := enc.EncodeString("fp"); err != nil {
		return err
	}
	if err := enc.EncodeArrayLen(3); err != nil {
		return err
	}
	if err := enc.EncodeUint(uint64(r.fp.Off)); err != nil {
		return err
	}
	if err := enc.EncodeUint(uint64(r.fp.Tag)); err != nil {
		return err
	}
	return enc.EncodeString(r.run)
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
