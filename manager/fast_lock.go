package manager

import "github.com/syncmgr/syncmgr/statemem"

// The fast-path families of the locks (see fastFamily): a Lock's and an
// RLock's state word, owner thread and since field are a slot of the
// segment, and so are those of a Condition's private RLock (a Condition
// over a Lock or RLock of its own uses that lock's words).

type lockFamily struct{}

func (lockFamily) kinds() []Kind { return []Kind{KindLock} }

func (fam lockFamily) bind(f *fastPath, obj Object) {
	o := obj.(*Lock)
	f.bindWords(o, fam, statemem.KindLock, &o.mu, &o.st.W0, &o.st.TID, &o.st.Since)
}

func (lockFamily) unbind(f *fastPath, obj Object) {
	o := obj.(*Lock)
	f.unbindWords(o, &o.mu, &o.st.W0, &o.st.TID, &o.st.Since)
}

// sweep hands on or frees a Lock whose owner field names no live
// session's slot, as a dead owner's would be, and clears a daemon bit with
// no daemon waiters queued.
func (lockFamily) sweep(obj Object, live func(Slot) bool) {
	o := obj.(*Lock)
	o.mu.Lock()
	if p := o.st.Owner(); p != 0 && o.dead == nil && !live(p) {
		o.handOn()
	}
	o.waiters.clearStray()
	o.mu.Unlock()
}

// sessionEnded does nothing: a Lock a session held is found by its word
// (statemem.Segment.Owned) and released before.
func (lockFamily) sessionEnded(Object, *Session) {}

func (lockFamily) waitOp() string { return "acquire" }

type rlockFamily struct{}

func (rlockFamily) kinds() []Kind { return []Kind{KindRLock} }

func (fam rlockFamily) bind(f *fastPath, obj Object) {
	o := obj.(*RLock)
	f.bindWords(o, fam, statemem.KindRLock, &o.mu, &o.st.W0, &o.st.TID, &o.st.Since)
}

func (rlockFamily) unbind(f *fastPath, obj Object) {
	o := obj.(*RLock)
	f.unbindWords(o, &o.mu, &o.st.W0, &o.st.TID, &o.st.Since)
}

// sweep is a Lock's sweep.
func (rlockFamily) sweep(obj Object, live func(Slot) bool) {
	o := obj.(*RLock)
	o.mu.Lock()
	if p, _, _ := o.st.Owner(); p != 0 && o.dead == nil && !live(p) {
		o.handOn()
	}
	o.waiters.clearStray()
	o.mu.Unlock()
}

// sessionEnded does nothing, as a Lock's.
func (rlockFamily) sessionEnded(Object, *Session) {}

func (rlockFamily) waitOp() string { return "acquire" }

// conditionFamily binds a Condition's private RLock (named after it), as
// an RLock's family does; the words are then the RLock's, in byOff.
type conditionFamily struct{}

func (conditionFamily) kinds() []Kind { return []Kind{KindCondition} }

func (conditionFamily) bind(f *fastPath, obj Object) {
	if r := obj.(*Condition).ownLock(); r != nil {
		rlockFamily{}.bind(f, r)
	}
}

func (conditionFamily) unbind(f *fastPath, obj Object) {
	if r := obj.(*Condition).ownLock(); r != nil {
		rlockFamily{}.unbind(f, r)
	}
}

// ownLock returns the Condition's private RLock, or nil when it is over a
// Lock or RLock of its own.
func (c *Condition) ownLock() *RLock {
	if r, ok := c.lock.(*RLock); ok && r.name == c.name+".lock" {
		return r
	}
	return nil
}
