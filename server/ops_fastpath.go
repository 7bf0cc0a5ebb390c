package server

import (
	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/metrics"
	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

// fastpathOps: the same-host fast path (package statemem; docs/protocol.md,
// "Same-host fast path"). A client on a Unix socket asks for the segment
// with fastpath_attach, whose reply carries the segment's descriptor
// (SCM_RIGHTS), then for each object's word offset with fastpath_ref; both
// replies name the daemon's run, so that a client never applies one run's
// offsets to another's segment. Any refusal means "use the socket path",
// which always works.
func fastpathOps(t *opTable) {
	const f = "fastpath"
	t.serverOp(f, wire.OpFastpathAttach, func(c *conn, _ uint64, a wire.Args) (any, error) {
		if err := c.fastpathAllowed(); err != nil {
			return nil, err
		}
		seg := c.srv.mgr.FastSegment()
		// The segment travels as a descriptor with this very reply, on the
		// connection that asked (fastpathAllowed checked it is a Unix
		// socket): a client maps the segment of the daemon that answers it,
		// never one found by name.
		return fdReply{fd: seg.FD(), res: map[string]any{"size": seg.Size(), "slot": int64(c.sess.Slot()),
			"boot_id": c.srv.bootID, "run": c.srv.runID}}, nil
	})
	t.serverOp(f, wire.OpFastpathRef, func(c *conn, _ uint64, a wire.Args) (any, error) {
		if err := c.fastpathAllowed(); err != nil {
			return nil, err
		}
		kind, err := a.String(wire.ArgKind)
		if err != nil {
			return nil, err
		}
		name, err := a.String(wire.ArgName)
		if err != nil {
			return nil, err
		}
		obj, err := c.srv.mgr.Lookup(manager.Kind(kind), name)
		if err != nil {
			return nil, err
		}
		ref, ok := c.srv.mgr.FastRef(obj)
		if !ok {
			return nil, wire.Errorf(wire.CodeUnknownOp, "%s %q is not on the fast path", kind, name)
		}
		return fastRefReply(c, ref), nil
	})
}

// fastRefReply is an object's word as fastpath_ref answers it: its offset
// and tag in the segment, and the daemon run they belong to. (A fast-path
// client's create carries the same three in an array: createReply.)
func fastRefReply(c *conn, ref statemem.Ref) *fastWord {
	return &fastWord{Off: int64(ref.Off), Tag: int64(ref.Tag), Run: c.srv.runID}
}

// fastWord is fastRefReply's answer, encoded as a map of off, tag and run.
type fastWord struct {
	Off int64  `msgpack:"off"`
	Tag int64  `msgpack:"tag"`
	Run string `msgpack:"run"`
}

// fastpathAllowed checks that this connection may use the fast path: the
// daemon has a segment, the client is on a Unix socket (so on this host;
// a TCP client maps nothing) and runs as the daemon's own user (root and,
// with --allow-other-users, other users may connect, but they never get a
// writable descriptor of the daemon's memory), and the session's end hook,
// which releases the words naming its slot, is registered.
func (c *conn) fastpathAllowed() error {
	if c.srv.mgr.FastSegment() == nil {
		return wire.Errorf(wire.CodeUnknownOp, "the fast path is disabled on this server")
	}
	if c.transport != metrics.TransportUnix {
		return wire.Errorf(wire.CodeUnknownOp, "the fast path is only for Unix-socket clients")
	}
	if !c.sameUser {
		return wire.Errorf(wire.CodeUnknownOp, "the fast path is only for the daemon's own user")
	}
	if !c.srv.mgr.AttachFastPath(c.sess) {
		return wire.Errorf(wire.CodeUnknownOp, "the fast path is not available to this session")
	}
	return nil
}

// fdReply is a result to be written together with a descriptor, passed as
// SCM_RIGHTS ancillary data on the reply frame's first byte.
type fdReply struct {
	fd  int
	res any
}
