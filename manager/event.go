package manager

import (
	"context"
	"time"
)

// Event is a level-triggered flag, as threading.Event. Its flag is an
// EventState; IsSet reads it without the mutex.
type Event struct {
	base
	st      EventState
	waiters waitQueue
}

func newEvent(name string) *Event {
	e := &Event{base: base{name: name}}
	e.waiters.word = &e.st.W0
	return e
}

// Kind implements Object.
func (e *Event) Kind() Kind { return KindEvent }

// State returns the event's state word.
func (e *Event) State() *EventState { return &e.st }

// IsSet reports the flag.
func (e *Event) IsSet() bool { return e.st.IsSet() }

// Set raises the flag and wakes every waiter.
func (e *Event) Set() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.st.Set()
	for w := e.waiters.front(); w != nil; w = e.waiters.front() {
		e.waiters.grant(w)
	}
}

// Clear lowers the flag.
func (e *Event) Clear() {
	e.mu.Lock()
	e.st.Clear()
	e.mu.Unlock()
}

// NoSince, as WaitGrant's since, counts only sets from the call on.
const NoSince int64 = -1

// SetSince reports whether the flag is set, or was set after generation
// since (not NoSince) even if cleared again.
func (e *Event) SetSince(since int64) bool {
	x := e.st.W0.Load()
	return x&eventFlag != 0 || (since >= 0 && int64(x&eventGenMax) != since)
}

// WaitGrant blocks until the flag is set or the timeout passes; the grant
// is OK when the flag was set. A set after generation since (a fast-path
// waiter's, moving to the daemon's queue; NoSince for none) counts too, so
// that no set between its futex wait and this one is missed. A wait takes
// nothing: there is nothing to undo.
func (e *Event) WaitGrant(ctx context.Context, timeout time.Duration, since int64) (Grant, error) {
	e.mu.Lock()
	if e.dead != nil {
		e.mu.Unlock()
		return Grant{}, e.dead
	}
	if set := e.SetSince(since); set || timeout == 0 {
		e.mu.Unlock()
		return Grant{ok: set}, nil
	}
	w := newWaiter(nil, 0)
	e.waiters.push(w)
	// The push set the daemon-waiters bit, after which a fast-path set goes
	// through the daemon; one that came before it is seen here.
	if e.SetSince(since) {
		e.waiters.remove(w)
		e.mu.Unlock()
		return Grant{ok: true}, nil
	}
	ok, err := e.park(ctx, &e.waiters, w, timeout)
	return Grant{ok: ok}, err
}

// Wait is WaitGrant's result: the flag, false on timeout.
func (e *Event) Wait(ctx context.Context, timeout time.Duration) (bool, error) {
	g, err := e.WaitGrant(ctx, timeout, NoSince)
	return g.OK(), err
}

// Describe implements Object.
func (e *Event) Describe() (string, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.st.IsSet() {
		return "set", e.waiters.len()
	}
	return "clear", e.waiters.len()
}

func (e *Event) fail(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dead = err
	e.waiters.failAll(err)
}
