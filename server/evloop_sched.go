package server

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// A busy event loop yields to its clients on wake-ups.
//
// With many client processes and few CPUs, a loop's thread woken by one
// client's request preempted that client (the kernel favours a thread that
// sleeps often), answered the one request, and slept again: about one
// sleep per two requests at 16 and 64 clients, where Redis's thread, which
// waits its turn, slept once per 20 to 40. Each sleep is a context switch,
// and the switches were most of the daemon's CPU per request.
//
// So while the daemon has at least Config.EventLoopMinConns plain
// connections, a loop's goroutine keeps its thread (runtime.LockOSThread)
// and that thread runs under SCHED_BATCH: a wake-up does not preempt the
// running process, so the loop runs when the client that woke it goes to
// wait for its reply, and finds the requests that other clients sent
// meanwhile. Below that count (a lone client, whose call would wait for
// the CPU it shares with the loop) the thread is SCHED_OTHER again and
// goes back to the runtime: a loop that keeps its thread answered a lone
// TCP client's Value get in 115 µs against 79. SCHED_BATCH keeps the
// thread's nice value and needs no privilege; where the call is refused (a
// seccomp filter) the loop stays as it is.

// pace sets the loop's thread's policy for the daemon's current number of
// plain connections. Called by the loop's goroutine after each wait.
func (l *evLoop) pace() {
	want := l.srv.plain.Load() >= int64(l.srv.cfg.EventLoopMinConns)
	if want == l.batch || l.schedOff {
		return
	}
	if want {
		runtime.LockOSThread()
		if err := setThreadBatch(true); err != nil {
			runtime.UnlockOSThread()
			l.schedOff = true
			l.srv.log.Debug().Err(err).Msg("event loop: SCHED_BATCH refused; the loop's thread keeps its policy")
			return
		}
		l.tid.Store(int64(unix.Gettid()))
		l.batch = true
		return
	}
	if err := setThreadBatch(false); err != nil {
		// The thread stays the loop's: no other goroutine runs under
		// SCHED_BATCH.
		l.schedOff = true
		l.srv.log.Debug().Err(err).Msg("event loop: SCHED_OTHER refused; the loop keeps its thread")
		return
	}
	l.tid.Store(0)
	l.batch = false
	runtime.UnlockOSThread()
}

// setThreadBatch puts the calling thread under SCHED_BATCH (on) or
// SCHED_OTHER (off), keeping its nice value.
func setThreadBatch(on bool) error {
	cur, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return err
	}
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL, Nice: cur.Nice}
	if on {
		attr.Policy = unix.SCHED_BATCH
	}
	return unix.SchedSetAttr(0, &attr, 0)
}
