// Package manager holds the semantics of syncmgr's shared objects: Lock,
// RLock, Semaphore, BoundedSemaphore, Event, Value and Queue, the registry
// that names them, and the sessions (client processes) that hold them.
//
// It knows nothing of sockets or frames. A transport (the socket server in
// package server today, a shared-memory fast path later) maps its requests to
// the methods here, each of which takes the calling *Session and, where it can
// block, a context.Context and a timeout.
//
// Every blocking operation follows the same pattern, after x/sync's
// semaphore: the waiter is queued under the object's mutex, the caller selects
// on the waiter's ready channel, its timer and its context, and on timeout or
// cancellation it re-locks and removes itself; if the grant raced in first it
// keeps the grant and reports success, so that nothing granted is ever
// dropped. A caller that cannot deliver a grant (its client is gone) gives it
// back with the matching undo (Release, Unget).
//
// When a session ends, every Lock, RLock and Semaphore unit it holds is
// released and handed to the next waiter.
package manager
