package server

import (
	"time"

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
// is busy (manager.Queue.Busy, for busySpin): if it is, the rest of the
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

// queueBusy reports whether the queue a's request names (c served by a
// loop) is busy now; false when it names none (the op then answers that).
func (c *conn) queueBusy(a wire.Args) bool {
	q, err := lookup[*manager.Queue](c, a)
	return err == nil && q.Busy(busySpin)
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
		closed := lp.closed
		if !closed {
			lp.rearm(c)
		}
		c.wmu.Unlock()
		if !closed {
			lp.loop.kick(c) // what it read meanwhile (rest), and what came since
		}
	}()
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

// isPaused reports whether a request of c runs off the loop.
func (lp *loopConn) isPaused(c *conn) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return lp.paused
}
