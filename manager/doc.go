// Package manager holds the semantics of syncmgr's shared objects, the
// registry that names them, and the sessions (client processes) that hold
// them. It knows nothing of sockets or frames: a transport (the socket
// server in package server) maps requests to the methods here, and
// same-host clients change the fast path's shared words and Queue rings
// themselves (fastpath.go, queue_store_ring.go).
//
// The fast path's families (fastpath.go's fastFamily, one line each in
// fastFamilies) each keep what is theirs in a file of their own: how an
// object's state is bound to shared memory and given back, what a stray
// store can break in it, what a dead session left there:
//
//	fast_lock.go        Lock, RLock, a Condition's private RLock
//	fast_semaphore.go   Semaphore, BoundedSemaphore (word and ledger)
//	fast_event_value.go Event, numeric Value
//	queue_ring_bind.go  Queue, JoinableQueue (a ring of its own)
//
// The 13 kinds, one file per family of semantics:
//
//	lock.go       Lock, RLock
//	semaphore.go  Semaphore, BoundedSemaphore
//	event.go      Event
//	value.go      Value (typed, with add and compare-and-set)
//	condition.go  Condition (over a Lock or RLock)
//	barrier.go    Barrier
//	queue.go      Queue, JoinableQueue (batches: queue_batch.go; a
//	              JoinableQueue's debts, items got and not marked done:
//	              queue_owed.go)
//	containers.go dict, Namespace (a dict), list
//
// A Queue's ops wait, grant and count debts the same way whatever keeps its
// items: a queueStore (queue.go), which tries and says what a change is.
// Two stores:
//
//	queue_store_list.go the daemon's list (a Queue off the fast path)
//	queue_store_ring.go a shared ring (fast path) and the daemon's items
//	                    before and after it; its binding and the sessions
//	                    it was passed to (queue_ring_bind.go), its waiting
//	                    and watcher (queue_ring_watch.go: socket waiters,
//	                    refills from the daemon's items), a JoinableQueue's
//	                    task counts in it (queue_ring_tasks.go)
//
// Another store is a type with queueStore's methods in a file of its own,
// swapped in as bindQueue swaps in a ringStore.
//
// Where an op's undo lives (grant.go): every blocking or consuming op
// returns a Grant, which the transport commits once its reply is written or
// undoes when it cannot deliver it; the undo is the object's own code, next
// to the op. The Grant-returning methods are Lock, RLock, Semaphore and
// Condition AcquireGrant; Condition, Event and Barrier WaitGrant; Queue
// GetGrant and PutGrant. The methods without the suffix (Acquire, Wait, Get,
// Put) commit at once, for callers that deliver the result themselves. Rule:
// an error means no effect.
//
// Every blocking operation waits as x/sync's semaphore does (wait.go): the
// waiter is queued under the object's mutex, the caller selects on the
// waiter's ready channel, its timer and its context, and on timeout or
// cancellation it re-locks and removes itself; if the grant raced in first
// it keeps it and returns it, so nothing granted is dropped.
//
// The registry (registry.go) names the objects, creates them within the
// manager's limits (manager.go: the kinds, Config) and collects anonymous
// ones nobody references any more; snapshot.go lists objects and sessions
// for status.
//
// Sessions (session.go, slots.go): a session has a never-reused ID (status
// listings) and a compact Slot, which objects record as owners; a slot is
// reused only after the session ended and nothing pins it (Slots.Pin). When
// a session ends, every Lock, RLock and Semaphore unit it holds is released
// and handed to the next waiter, a Barrier action it owed breaks the
// barrier, and then its end hooks (Session.OnEnd) run.
//
// State (state.go): the state of Lock, RLock, Semaphore, BoundedSemaphore
// and Event is a state word (a Semaphore's with a ledger of units per
// session slot), and a numeric Value's an 8-byte cell; the op semantics read
// and write it only through those types, whose comment gives the layout.
// The same-host fast path (fastpath.go) binds those words into a shared
// segment (package statemem) without changing the semantics. Every process
// given the segment can write it, so what is read there is data: ledger
// entries are clamped to a Semaphore's total, a latch naming no live
// attached session is taken over, a latch wait keeps the request's
// deadline and a session's end never waits on another session's latch
// (semaphore.go, deferLatched), and a sweep (sweepFast) frees Lock and
// RLock words naming no live slot and clears daemon bits nobody set and
// heir fields naming no live slot.
// fastwait.go lists the fast-path waiters from the segment's waiter table
// and frees a session's entries and heir reservations when it ends.
package manager
