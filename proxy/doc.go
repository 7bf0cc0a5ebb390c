// Package proxy is the Go client of the syncmgr daemon.
//
// A Client is one authenticated connection (and one session: what it holds
// is released if it disconnects). It is safe for concurrent use: requests are
// multiplexed by id, so a goroutine blocked in Lock.Acquire does not stall
// the others. Handles are split by family as the daemon's ops are: sync.go
// (Lock, RLock, Semaphore, BoundedSemaphore, Event, Value, Condition,
// Barrier), queue.go (Queue, JoinableQueue), containers.go (dict, list,
// namespace); op, kind and argument names come from package wire.
//
// Queue items, Value("O") values, dict keys and values, list items and
// namespace attributes are values in the encoding the Python client shares
// (values.go, docs/protocol.md section 10): plain data as msgpack, read back
// as nil, bool, int64, uint64, float64, string, []byte, []any and maps; a
// value Python pickled arrives as a Pickle, which can be stored again as it
// is. DialEnv (env.go) finds the daemon and key from the same environment
// variables as Python.
//
// Dial sends its ready frame as soon as it is connected (once more without
// it for a daemon older than that), and retries a limit answer or a
// handshake the daemon dropped until its context's deadline (10 s when it
// has none). WithFastPath (fastpath.go) puts Lock, RLock, Condition-lock,
// Semaphore and Event handles on the same-host fast path, and a Queue's
// Put, TryPut, Get, TryGet and Len on its shared ring (queue_fast.go,
// statemem.ClientRing: the protocol the Python client follows, so both
// share one FIFO with the socket clients; Queue.FastPath reports it). A
// JoinableQueue's TaskDone and Join work on its ring too: its task counts
// are in the ring, and the client keeps its debts there as the Python
// client does (a get owes its item; TaskDone pays its own debt first, else
// another's; one too many is a value_error that stores nothing). A ring
// op the ring cannot serve (a flag set, damage, a large item, no room, a
// latch held past 2 ms) goes over the socket with what is left of its
// context; a Get decodes its item before it takes it, so an item that does
// not decode stays at the head.
//
// An error means no effect. Every call that can block takes a
// context.Context; a deadline is also sent as the op's timeout, so the
// daemon ends the wait itself. When the context ends first the client
// cancels the request on the daemon and waits for its answer. If a result
// raced in, a call that can undo it (acquire: release; get: unget) does so
// and returns the context's error; a call whose effect is public at once
// (Queue.Put, Barrier.Wait, Condition.Wait) returns that result instead, so
// it never reports an error for something that happened. Condition.Wait
// that returns nil holds the lock again (notified or timed out); one that
// returns an error does not hold it.
//
// Errors the daemon answered are *wire.Error values, matched with errors.Is
// against ErrEmpty, ErrFull, ErrNotOwner, ... (which compare codes); a dead
// connection is ErrConnectionLost (or ErrClosed after Close), which also
// matches ErrShutdown when the daemon said it was stopping gracefully. Dial
// to an address where no daemon listens returns ErrNoDaemon, whose message
// names the command that starts one. A Client does not reconnect: after a
// daemon restart, Dial again and get the handles again (named objects by
// their names; their state starts empty).
//
//	c, err := proxy.Dial(ctx, "/run/user/1000/syncmgr.sock", key)
//	lock, err := c.Lock(ctx, "ingest")
//	if err := lock.Acquire(ctx); err != nil { ... }
//	defer lock.Release(ctx)
package proxy
