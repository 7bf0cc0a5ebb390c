package manager

import (
	"context"
	"time"
)

// Event is a level-triggered flag, as threading.Event.
type Event struct {
	base
	flag    bool
	waiters waitQueue
}

func newEvent(name string) *Event { return &Event{base: base{name: name}} }

// Kind implements Object.
func (e *Event) Kind() Kind { return KindEvent }

// IsSet reports the flag.
func (e *Event) IsSet() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.flag
}

// Set raises the flag and wakes every waiter.
func (e *Event) Set() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flag = true
	for w := e.waiters.front(); w != nil; w = e.waiters.front() {
		e.waiters.grant(w)
	}
}

// Clear lowers the flag.
func (e *Event) Clear() {
	e.mu.Lock()
	e.flag = false
	e.mu.Unlock()
}

// Wait blocks until the flag is set or the timeout passes, and returns the
// flag (false on timeout).
func (e *Event) Wait(ctx context.Context, timeout time.Duration) (bool, error) {
	e.mu.Lock()
	if e.dead != nil {
		e.mu.Unlock()
		return false, e.dead
	}
	if e.flag || timeout == 0 {
		f := e.flag
		e.mu.Unlock()
		return f, nil
	}
	w := newWaiter(nil, 0)
	e.waiters.push(w)
	return e.park(ctx, &e.waiters, w, timeout)
}

// Describe implements Object.
func (e *Event) Describe() (string, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.flag {
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
