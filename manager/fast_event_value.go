package manager

import "github.com/syncmgr/syncmgr/statemem"

// The fast-path families of Events and numeric Values (see fastFamily): an
// Event's state word is a slot of the segment, and a numeric Value's cell
// is a slot's aux word ('c' and 'O' Values stay in the daemon).

type eventFamily struct{}

func (eventFamily) kinds() []Kind { return []Kind{KindEvent} }

func (fam eventFamily) bind(f *fastPath, obj Object) {
	o := obj.(*Event)
	f.bindWords(o, fam, statemem.KindEvent, &o.mu, &o.st.W0, nil, nil)
}

func (eventFamily) unbind(f *fastPath, obj Object) {
	o := obj.(*Event)
	f.unbindWords(o, &o.mu, &o.st.W0, nil, nil)
}

// sweep clears a daemon bit with no daemon waiters queued.
func (eventFamily) sweep(obj Object, _ func(Slot) bool) {
	o := obj.(*Event)
	o.mu.Lock()
	o.waiters.clearStray()
	o.mu.Unlock()
}

// sessionEnded does nothing: nobody holds an Event.
func (eventFamily) sessionEnded(Object, *Session) {}

func (eventFamily) waitOp() string { return "wait" }

type valueFamily struct{}

func (valueFamily) kinds() []Kind { return []Kind{KindValue} }

func (fam valueFamily) bind(f *fastPath, obj Object) {
	if o := obj.(*Value); o.numeric() {
		f.bindWords(o, fam, statemem.KindValue, &o.mu, nil, &o.cell.Bits, nil)
	}
}

func (valueFamily) unbind(f *fastPath, obj Object) {
	o := obj.(*Value)
	f.unbindWords(o, &o.mu, nil, &o.cell.Bits, nil)
}

// sweep does nothing: any bits are a value.
func (valueFamily) sweep(Object, func(Slot) bool) {}

// sessionEnded does nothing: nobody holds a Value.
func (valueFamily) sessionEnded(Object, *Session) {}

func (valueFamily) waitOp() string { return "acquire" }
