package server

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// A queue op that would wait for another holder runs off the loop.
//
// A Queue's ops run under its mutex and, with a ring, under the ring's
// latch, which fast-path clients take too. Either is held for moments; a
// latch that a stopped or misbehaving client keeps is waited out for
// statemem.LatchWait (2 s) before the op fails. In a loop's goroutine that
// wait was every other connection's of the loop too, once per such op. So
// a queue op of a connection a loop serves first looks whether the queue
// is busy (manager.Queue.Busy, for busySpin), and so do a delete and a
// decref of a queue; status always leaves the loop (leavesLoop). Such a
// request's dispatch runs in a goroutine of its own (offLoop), and the
// loop reads and runs nothing more of that connection until it is done:
// the connection's requests still run one at a time, in order, and its
// replies go out in that order. A wait that request goes on to park (a get
// of an empty queue) is parked as before, and ends the pause. The undos of
// a connection's replies that never went out (letGo) run off the loop
// too: an undo waits out a held latch, for as long as it is held, rather
// than lose its item.

// busySpin is how long a queue's mutex or latch may stay held before an
// op on it leaves the loop: longer than any op holds either while it runs.
const busySpin = 50 * time.Microsecond

// leavesLoop reports whether o, an op of a connection a loop serves, runs
// off the loop: a queue op whose queue is busy; a delete or decref of a
// queue that is busy (they end it, under its mutex); and status, which
// reads every object (the queues under their mutexes) and takes
// milliseconds for many.
func (c *conn) leavesLoop(o *op, a wire.Args) bool {
	switch {
	case o.family == queueFamily:
		q, err := lookup[*manager.Queue](c, a)
		return err == nil && q.Busy(busySpin) // (no queue: the op answers that)
	case o.name == wire.OpStatus:
		return true
	case o.name == wire.OpDelete || o.name == wire.OpDecref:
		name, err := a.String(wire.ArgName)
		return err == nil && c.srv.mgr.QueueBusy(name, busySpin)
	}
	return false
}

// offLoop runs run, the rest of a request's dispatch, in a goroutine of
// its own, and pauses c's reading until it returns. It reports false, and
// does nothing, when c is not in a loop or is ending.
func (c *conn) offLoop(run func()) bool {
	lp := c.lp.Load()
	if lp == nil {
		return false
	}
	if !c.addGoroutine() {
		return false
	}
	c.wmu.Lock()
	lp.paused = true
	if !lp.closed {
		lp.rearm(c)
	}
	c.wmu.Unlock()
	go func() {
		defer c.pwg.Done()
		run()
		c.wmu.Lock()
		lp.paused = false
		after := lp.afterOff
		lp.afterOff = nil
		closed := lp.closed
		if !closed {
			if lp.detached {
				lp.detached = false
				lp.interest = 0 // (back in the set with none, then as rearm says)
				if err := unix.EpollCtl(lp.loop.epfd, unix.EPOLL_CTL_ADD, lp.fd,
					&unix.EpollEvent{Events: 0, Fd: int32(lp.fd)}); err != nil {
					c.log.Warn().Err(err).Msg("epoll_ctl add")
				}
			}
			lp.rearm(c)
		}
		c.wmu.Unlock()
		if after != nil {
			after()
		}
		if !closed {
			lp.loop.kick(c) // what it read meanwhile (rest), what came since, and its end
		}
	}()
	return true
}

// detach takes a paused connection's socket out of its loop's epoll set,
// and reports whether it is paused: it reported a hang-up or an error,
// which epoll reports whatever the interest; offLoop puts it back when the
// request is done, and the loop then reads what the peer sent before it
// went, and its end.
func (lp *loopConn) detach(c *conn) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !lp.paused {
		return false
	}
	if !lp.closed && !lp.detached {
		lp.detached = true
		_ = unix.EpollCtl(lp.loop.epfd, unix.EPOLL_CTL_DEL, lp.fd, nil)
	}
	return true
}

// afterOffLoop has release, the undos of c's unwritten replies (letGo), run
// once the request that runs off the loop is done, and reports true; false
// when none does. That request came after the replies, and its grant's
// undo, if any, goes first: latest first.
func (lp *loopConn) afterOffLoop(c *conn, release func()) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !lp.paused {
		return false
	}
	lp.afterOff = release
	return true
}

// addGoroutine counts, in pwg, a goroutine about to start on c's behalf (c's
// session ends after it: serve waits for pwg), unless c is draining.
func (c *conn) addGoroutine() bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.draining {
		return false
	}
	c.pwg.Add(1)
	return true
}
