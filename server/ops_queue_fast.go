package server

import (
	"net"
	"time"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/metrics"
	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

// opQueueAttach answers a same-host client's queue_attach with the layout
// of a Queue's ring; the reply frame carries the ring's memory file with
// SCM_RIGHTS (the file is anonymous: nothing on a file system can be
// planted or swapped). Any refusal means "use the socket path".
func opQueueAttach(c *conn, id uint64, a wire.Args) (any, manager.Grant, error) {
	if err := c.fastpathAllowed(); err != nil {
		return nil, manager.Grant{}, err
	}
	q, err := lookup[*manager.Queue](c, a)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	r := q.Ring()
	if r == nil {
		return nil, manager.Grant{}, wire.Errorf(wire.CodeUnknownOp, "queue %q is not on the fast path", q.Name())
	}
	// A JoinableQueue's ring only for a client that keeps its task counts
	// (the debts and journal of docs/protocol.md): one that did not would
	// get items nobody owes, and a join would wait for ever on a dead
	// consumer's.
	tasks, err := a.Bool(wire.ArgTasks, false)
	if err != nil {
		return nil, manager.Grant{}, err
	}
	if q.Kind() == manager.KindJoinableQueue && !tasks {
		return nil, manager.Grant{}, wire.Errorf(wire.CodeUnknownOp, "joinable queue %q: this client does not keep its task counts on the fast path", q.Name())
	}
	slot := c.sess.Slot()
	if slot == 0 || slot >= statemem.RingSlots {
		return nil, manager.Grant{}, wire.Errorf(wire.CodeUnknownOp, "the queue fast path is not available to this session")
	}
	if c.transport != metrics.TransportUnix || id == 0 {
		return nil, manager.Grant{}, wire.Errorf(wire.CodeUnknownOp, "the queue fast path is only for Unix-socket clients")
	}
	q.RingPassed(slot) // before the reply: the client may change the ring as soon as it has it
	frame, err := wire.EncodeReply(id, nil, map[string]any{"size": r.Size(), "slot": int64(slot),
		"capacity": int64(r.Capacity()), "inline": int64(r.Inline()), "maxsize": int64(r.Maxsize()),
		"joinable": q.Kind() == manager.KindJoinableQueue})
	if err != nil {
		return nil, manager.Grant{}, err
	}
	err = r.WithFD(func(fd int) error { return c.write(net.Buffers{frame}, fd, nil) })
	if err == statemem.ErrRingClosed {
		return nil, manager.Grant{}, wire.Errorf(wire.CodeUnknownOp, "queue %q is not on the fast path", q.Name())
	}
	c.srv.cfg.Metrics.Op(c.cur.kind, c.cur.op, result(err))
	return nil, manager.Grant{}, errParked // answered here
}

// queueWaiting adds the fast-path clients' threads asleep on Queue rings
// (one entry per thread; "for" from when the first of a session's began).
func (s *Server) queueWaiting(now time.Time, out []Waiting) []Waiting {
	for _, w := range s.mgr.QueueWaiting() {
		var d float64
		if !w.Since.IsZero() {
			d = now.Sub(w.Since).Seconds()
		}
		for i := 0; i < w.Count; i++ {
			out = append(out, Waiting{Session: w.Session, Kind: w.Kind, Name: w.Name, Op: w.Op, For: d})
		}
	}
	return out
}
