package server

import (
	"os"

	"github.com/syncmgr/syncmgr/shmregistry"
	"github.com/syncmgr/syncmgr/wire"
)

// shmOps: the shared-memory segment registry (package shmregistry); see
// docs/protocol.md.
func shmOps(t *opTable) {
	const f = "shm"
	t.serverOp(f, wire.OpShmCreate, shmOp(func(c *conn, r *shmregistry.Registry, a wire.Args) (any, error) {
		name, err := a.OptString(wire.ArgName)
		if err != nil {
			return nil, err
		}
		size, err := a.Int(wire.ArgSize, 0)
		if err != nil {
			return nil, err
		}
		seg, err := r.Create(c.sess.ID, name, size)
		if err != nil {
			return nil, err
		}
		c.watchShm()
		return c.segmentInfo(seg), nil
	}))
	t.serverOp(f, wire.OpShmAttach, shmOp(func(c *conn, r *shmregistry.Registry, a wire.Args) (any, error) {
		name, err := a.String(wire.ArgName)
		if err != nil {
			return nil, err
		}
		seg, err := r.Attach(c.sess.ID, name)
		if err != nil {
			return nil, err
		}
		c.watchShm()
		return c.segmentInfo(seg), nil
	}))
	t.serverOp(f, wire.OpShmDetach, shmOp(func(c *conn, r *shmregistry.Registry, a wire.Args) (any, error) {
		name, err := a.String(wire.ArgName)
		if err != nil {
			return nil, err
		}
		r.Detach(c.sess.ID, name)
		return nil, nil
	}))
	t.serverOp(f, wire.OpShmUnlink, shmOp(func(c *conn, r *shmregistry.Registry, a wire.Args) (any, error) {
		name, err := a.String(wire.ArgName)
		if err != nil {
			return nil, err
		}
		return nil, r.Unlink(name)
	}))
	t.serverOp(f, wire.OpShmList, shmOp(func(c *conn, r *shmregistry.Registry, a wire.Args) (any, error) {
		used, limit := r.Usage()
		return map[string]any{"segments": r.List(), "used": used, "limit": limit, "dir": r.Dir()}, nil
	}))
}

func shmOp(fn func(c *conn, r *shmregistry.Registry, a wire.Args) (any, error)) handler {
	return func(c *conn, _ uint64, a wire.Args) (any, error) {
		r := c.srv.cfg.Shm
		if r == nil {
			return nil, wire.Errorf(wire.CodeUnknownOp, "the shared-memory registry is disabled on this server")
		}
		return fn(c, r, a)
	}
}

func (c *conn) segmentInfo(s shmregistry.Segment) map[string]any {
	return map[string]any{"name": s.Name, "path": s.Path, "size": s.Size, "boot_id": c.srv.bootID, "uid": os.Geteuid()}
}

// watchShm makes the registry forget the session's attachments when the
// session ends (its mappings died with its processes): an end hook of the
// session, registered once.
func (c *conn) watchShm() {
	sess := c.sess
	if _, loaded := c.srv.shmWatched.LoadOrStore(sess.ID, struct{}{}); loaded {
		return
	}
	r := c.srv.cfg.Shm
	id := sess.ID
	if !sess.OnEnd(func() {
		r.EndSession(id)
		c.srv.shmWatched.Delete(id)
	}) {
		r.EndSession(id) // it ended meanwhile
		c.srv.shmWatched.Delete(id)
	}
}
