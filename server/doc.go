// Package server is syncmgr's socket transport: it accepts connections on
// Unix and TCP listeners, runs the handshake, reads frames, and maps each
// request to package manager. It holds no object semantics of its own.
//
// Where an op's wire form lives: the op table (optable.go) is built once by
// newOpTable from one function per family, each in its own file:
// ops_admin.go (ping, create, delete, references, cancel, status),
// ops_sync.go (Lock, RLock, Semaphore, BoundedSemaphore, Condition, Event,
// Barrier, Value), ops_queue.go (Queue, JoinableQueue; ops_queue_fast.go:
// queue_attach, which passes a Queue's ring with SCM_RIGHTS), ops_containers.go
// (dict, Namespace, list), ops_shm.go (shared-memory segments) and
// ops_fastpath.go (fastpath_attach, which passes the state segment with
// SCM_RIGHTS, and fastpath_ref). A handler
// reads its arguments and calls the manager; a granting op returns the
// manager's Grant with its reply. errors.go is the one place Go errors
// become wire codes.
//
// TCP connections, plain and TLS, and Unix ones once the server has
// Config.EventLoopMinConns plain connections, are served by its event loops
// (evloop.go): a goroutine with an epoll set of its own that reads,
// executes and answers the requests of every ready connection, one
// connection's requests in order. A TLS connection's records go through
// its tls.Conn, over the socket below it in loop mode (evloop_tls.go).
// Otherwise (a Unix connection while the server has fewer, or every
// connection when Config.EventLoops is negative) a connection is served by
// a goroutine of its own that does the same for it alone (conn.loop); a
// Unix one moves into a loop between two requests once the server is busy.
// From that count on, a loop's goroutine keeps its thread and runs it
// under SCHED_BATCH, so that a client's wake-up does not preempt the client
// and the loop finds several requests when it runs (evloop_sched.go). A
// queue op whose queue is busy elsewhere (a ring latch a stopped client
// keeps) runs in a goroutine of its own, the connection's reading paused
// meanwhile, and so do a delete of such a queue, every status, and the
// undos of a connection's unwritten replies (evloop_offloop.go): a loop
// never waits on one queue for its others.
// Sockets are read and written by raw system calls on their non-blocking
// descriptor, a goroutine's waiting through the runtime's poller only when
// it is not ready (rawio.go; below crypto/tls, listen.go's sniffConn,
// which in a loop answers would-block instead of waiting). While the rest
// of a large body is still to come on a TCP socket, its SO_RCVLOWAT defers
// the reader's wake-up until 256 KiB have arrived (rawIO.expect,
// loopConn.setLowat). Either way, a request that has to wait is parked in a goroutine of its own with a context
// derived from the connection's. Whether it replies at once or later, a
// granting op's reply goes through conn.deliver, which commits the grant
// once the reply is in the socket and undoes it when the connection is gone
// or the write fails (or its output stalls for the write timeout): no
// handler writes an undo. In a loop, a reply the socket cannot take at once
// waits in the connection's output queue with its grant, as do the replies
// to the requests that one read brought together (a pipelining client's),
// which then go out in one writev; the loop stops reading a connection with
// a megabyte of replies waiting, and stops running the requests of a read
// there too (the rest wait in loopConn.rest). When the connection ends,
// its context is cancelled, every parked
// request is finished, and only then is the connection's session closed, so
// a dead client never takes a lock or a queue item. Clean-up owed when a
// session ends is registered with Session.OnEnd, not watched from here.
//
// A frame over --max-frame after the handshake is answered too_large under
// its request id and skipped (conn.skipOversized); the session lives on.
//
// Connections in the handshake are admitted by admission.go: a budget per
// transport from which the busiest source's wrong keys, then its silent
// peers, are dropped first (clients speak first, so an honest one is seldom
// silent); wrong keys are answered late, after a back-off per source, and a
// right key is never refused or slowed for others' failures.
package server
