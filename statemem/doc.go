// Package statemem keeps the state words of small synchronization objects
// (Lock, RLock, Semaphore, BoundedSemaphore, Event, numeric Value) in one
// daemon-owned shared-memory segment, so that clients on the daemon's host
// can change them with one compare-and-swap and sleep on them with a futex,
// without a round trip to the daemon.
//
// The daemon stays the arbiter: it creates the segment as an anonymous
// memory file (memfd_create, mode 0600, sealed against shrinking and
// growing, so no name exists for anyone to plant or leave behind and no
// process can truncate it under another's mapping) and hands it to
// same-user clients as a descriptor over the Unix socket (SCM_RIGHTS). It
// allocates one 64-byte object slot per object (and a Semaphore a ledger of
// units per session slot besides), keeping what it put where in its own
// memory: it never reads a kind, an offset or a length back from the
// segment to manage it, and bounds every value it does read there (words,
// ledger entries, latches) by what the object can hold. It runs its own
// socket-path ops on the same words with the same compare-and-swap
// protocol. When it has waiters of its own queued on an object it sets the
// word's daemon bit (BitDaemon), which sends every client to the socket
// path for that object until the queue is empty. When a session ends it
// releases the words that name the session's slot id and gives back the
// Semaphore units its ledger entries count; a Semaphore's latch (see
// SemAcquire) lets it recount a session killed mid-op.
//
// Waits (waiters.go) stay on the futex for their whole timeout; each waiting
// thread holds an entry of the segment's waiter table (a pool shared by all
// session slots), which the daemon reads for status and frees when the
// session ends. Locks and RLocks wake one sleeper per release, and a
// Semaphore commit that leaves units free wakes one. Locks, RLocks and Semaphores
// bound unfairness as Go's sync.Mutex does: a waiter that has waited
// StarveAfter becomes the heir, for whom the next free turn (a Semaphore's
// last free unit) is reserved.
//
// A Queue's items live apart, in a Ring (ring.go): a byte ring of records
// in a sealed anonymous memory file of its own, passed to clients with
// SCM_RIGHTS. Every op on it holds the ring's latch (ring_latch.go) and
// commits with one store (the tail word for a put, the head word for a
// get; one for a whole batch: Ring.PutMany, Ring.GetMany), so the repair
// of a session killed mid-op is letting go of its latch. A JoinableQueue's get and task_done change a debt (ring_tasks.go)
// after their commit; they journal it first, and the daemon finishes it
// when it takes over a dead holder's latch (Ring.repair). The daemon checks
// every position and length it reads from a ring, from one reading of the
// words per op (Ring.ends). A ClientRing (ring_client.go) is a Go client's
// side of the same protocol for Queues and JoinableQueues (their debts and journal too): it
// checks what it reads against the layout the daemon's reply gave, and
// answers Daemon (send the op over the socket) for anything it cannot do.
//
// The word ops are in ops.go (what every family shares) and one file per
// family, as the C extension's are: ops_lock.go, ops_semaphore.go,
// ops_event_value.go.
//
// The layout (layout.go, waiters.go, ring.go) is the contract with the C
// extension of the Python client (pyclient/csrc/), whose copy of every
// constant layout_c_test.go compares with these; docs/protocol.md,
// section "Same-host fast path", describes it for other implementations.
package statemem
