package manager

import (
	"bytes"
	"container/list"
	"fmt"
)

// The server never unpickles, so container entries are opaque: a dict entry
// is (key, keyPickle, valuePickle), where key is the canonical encoding the
// client computed (equal Python keys give equal bytes) and keyPickle is
// what keys() returns. A list item is a value pickle.

// DictEntry is one entry of a Dict.
type DictEntry struct {
	Key   []byte // canonical key
	KeyP  []byte // the key as the client wants it back
	Value []byte
}

// Dict is an insertion-ordered map of opaque entries, as the dict behind
// SyncManager's DictProxy (kind "dict") or NamespaceProxy (kind
// "namespace"). Every operation is atomic.
type Dict struct {
	base
	kind    Kind
	entries map[string]*list.Element
	order   list.List // of *DictEntry
	bytes   int64
	lim     *byteLimits // nil: no byte limits
	held    int64       // counted bytes (EntryCost of every entry)
}

func newDict(name string, kind Kind) *Dict {
	return &Dict{base: base{name: name}, kind: kind, entries: make(map[string]*list.Element)}
}

// Kind implements Object.
func (d *Dict) Kind() Kind { return d.kind }

// Get returns the entry for key.
func (d *Dict) Get(key []byte) (DictEntry, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.entries[string(key)]; ok {
		return *e.Value.(*DictEntry), true
	}
	return DictEntry{}, false
}

// Set stores an entry, keeping its position if the key exists. Over a
// byte limit it fails with ErrLimit and stores nothing.
func (d *Dict) Set(e DictEntry) error {
	return d.Update([]DictEntry{e})
}

// reserve charges what storing es would add (or gives back what it would
// free); call under d.mu. On error nothing is charged.
func (d *Dict) reserve(es []DictEntry) error {
	var delta int64
	var seen map[string]int // value sizes of keys set earlier in es
	if len(es) > 1 {
		seen = make(map[string]int, len(es))
	}
	for _, e := range es {
		if n, ok := seen[string(e.Key)]; ok {
			delta += int64(len(e.Value) - n)
		} else if el, ok := d.entries[string(e.Key)]; ok {
			delta += int64(len(e.Value) - len(el.Value.(*DictEntry).Value))
		} else {
			delta += EntryCost(e)
		}
		if seen != nil {
			seen[string(e.Key)] = len(e.Value)
		}
	}
	if d.dead != nil && delta > 0 {
		return d.dead
	}
	if delta < 0 {
		d.held += delta
		d.lim.release(-delta)
		return nil
	}
	if err := d.lim.charge(d.held, delta); err != nil {
		return err
	}
	d.held += delta
	return nil
}

func (d *Dict) setLocked(e DictEntry) {
	if el, ok := d.entries[string(e.Key)]; ok {
		old := el.Value.(*DictEntry)
		d.bytes += int64(len(e.Value) - len(old.Value))
		old.Value = e.Value
		return
	}
	c := e
	d.entries[string(e.Key)] = d.order.PushBack(&c)
	d.bytes += int64(len(e.Key) + len(e.KeyP) + len(e.Value))
}

// SetDefault returns the existing entry for e.Key, or stores e and returns it.
func (d *Dict) SetDefault(e DictEntry) (DictEntry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if el, ok := d.entries[string(e.Key)]; ok {
		return *el.Value.(*DictEntry), nil
	}
	if err := d.reserve([]DictEntry{e}); err != nil {
		return DictEntry{}, err
	}
	d.setLocked(e)
	return e, nil
}

// Update stores several entries atomically: all of them, or none when a
// byte limit would be passed (ErrLimit).
func (d *Dict) Update(es []DictEntry) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.reserve(es); err != nil {
		return err
	}
	for _, e := range es {
		d.setLocked(e)
	}
	return nil
}

// Delete removes key and returns its entry.
func (d *Dict) Delete(key []byte) (DictEntry, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.deleteLocked(key)
}

func (d *Dict) deleteLocked(key []byte) (DictEntry, bool) {
	el, ok := d.entries[string(key)]
	if !ok {
		return DictEntry{}, false
	}
	e := el.Value.(*DictEntry)
	d.order.Remove(el)
	delete(d.entries, string(key))
	d.bytes -= int64(len(e.Key) + len(e.KeyP) + len(e.Value))
	d.held -= EntryCost(*e)
	d.lim.release(EntryCost(*e))
	return *e, true
}

// PopItem removes and returns the last entry (LIFO, as dict.popitem).
func (d *Dict) PopItem() (DictEntry, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	el := d.order.Back()
	if el == nil {
		return DictEntry{}, false
	}
	return d.deleteLocked(el.Value.(*DictEntry).Key)
}

// Value returns the value stored under key; a missing key is ErrKey.
func (d *Dict) Value(key []byte) ([]byte, error) {
	e, ok := d.Get(key)
	if !ok {
		return nil, fmt.Errorf("%w: key not found", ErrKey)
	}
	return e.Value, nil
}

// Pop removes key and returns its value; a missing key is ErrKey.
func (d *Dict) Pop(key []byte) ([]byte, error) {
	e, ok := d.Delete(key)
	if !ok {
		return nil, fmt.Errorf("%w: key not found", ErrKey)
	}
	return e.Value, nil
}

// PopLast removes and returns the last entry; an empty dict is ErrKey.
func (d *Dict) PopLast() (DictEntry, error) {
	e, ok := d.PopItem()
	if !ok {
		return e, fmt.Errorf("%w: popitem(): dictionary is empty", ErrKey)
	}
	return e, nil
}

// Len returns the number of entries.
func (d *Dict) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.entries)
}

// Clear removes every entry.
func (d *Dict) Clear() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.entries = make(map[string]*list.Element)
	d.order.Init()
	d.bytes = 0
	d.lim.release(d.held)
	d.held = 0
}

// Snapshot returns every entry in insertion order.
func (d *Dict) Snapshot() []DictEntry {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]DictEntry, 0, len(d.entries))
	for el := d.order.Front(); el != nil; el = el.Next() {
		out = append(out, *el.Value.(*DictEntry))
	}
	return out
}

// Describe implements Object.
func (d *Dict) Describe() (string, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return fmt.Sprintf("%d entries, %d bytes", len(d.entries), d.bytes), 0
}

func (d *Dict) fail(err error) {
	d.mu.Lock()
	d.dead = err
	d.lim.release(d.held) // a deleted dict's entries are garbage
	d.held = 0
	d.mu.Unlock()
}

// List is a sequence of opaque items, as the list behind SyncManager's
// ListProxy. Each operation is atomic; Version changes on every mutation so
// that a client can do read-modify-write (sort, slice assignment) with
// Replace as a compare-and-swap.
type List struct {
	base
	items   [][]byte
	version uint64
	lim     *byteLimits // nil: no byte limits
	held    int64       // counted bytes (ItemCost of every item)
}

// adjust charges (or gives back) delta counted bytes; call under l.mu. On
// error nothing is charged.
func (l *List) adjust(delta int64) error {
	if delta < 0 {
		l.held += delta
		l.lim.release(-delta)
		return nil
	}
	if l.dead != nil {
		return l.dead
	}
	if err := l.lim.charge(l.held, delta); err != nil {
		return err
	}
	l.held += delta
	return nil
}

func itemsCost(vs [][]byte) int64 {
	var n int64
	for _, v := range vs {
		n += ItemCost(v)
	}
	return n
}

func newList(name string) *List { return &List{base: base{name: name}} }

// Kind implements Object.
func (l *List) Kind() Kind { return KindList }

// norm turns a Python-style index (negative from the end) into a position.
func norm(i int64, n int) (int, error) {
	if i < 0 {
		i += int64(n)
	}
	if i < 0 || i >= int64(n) {
		return 0, fmt.Errorf("%w: list index out of range", ErrIndex)
	}
	return int(i), nil
}

// GetItem returns item i.
func (l *List) GetItem(i int64) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, err := norm(i, len(l.items))
	if err != nil {
		return nil, err
	}
	return l.items[p], nil
}

// SetItem replaces item i.
func (l *List) SetItem(i int64, v []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, err := norm(i, len(l.items))
	if err != nil {
		return err
	}
	if err := l.adjust(int64(len(v) - len(l.items[p]))); err != nil {
		return err
	}
	l.items[p] = v
	l.version++
	return nil
}

// DelItem removes item i.
func (l *List) DelItem(i int64) error {
	_, err := l.Pop(i)
	return err
}

// Pop removes and returns item i.
func (l *List) Pop(i int64) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.items) == 0 {
		return nil, fmt.Errorf("%w: pop from empty list", ErrIndex)
	}
	p, err := norm(i, len(l.items))
	if err != nil {
		return nil, err
	}
	v := l.items[p]
	l.items = append(l.items[:p], l.items[p+1:]...)
	l.version++
	_ = l.adjust(-ItemCost(v))
	return v, nil
}

// Extend appends items: all of them, or none over a byte limit (ErrLimit).
func (l *List) Extend(vs ...[]byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.adjust(itemsCost(vs)); err != nil {
		return err
	}
	l.items = append(l.items, vs...)
	l.version++
	return nil
}

// Insert inserts v before position i (clamped, as list.insert).
func (l *List) Insert(i int64, v []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.adjust(ItemCost(v)); err != nil {
		return err
	}
	n := int64(len(l.items))
	if i < 0 {
		i = max(i+n, 0)
	}
	i = min(i, n)
	l.items = append(l.items, nil)
	copy(l.items[i+1:], l.items[i:])
	l.items[i] = v
	l.version++
	return nil
}

// Index returns the position of the first item equal to v (by bytes).
func (l *List) Index(v []byte) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, x := range l.items {
		if bytes.Equal(x, v) {
			return i, true
		}
	}
	return 0, false
}

// IndexOf returns the index of the first item equal to v; none is ErrValue.
func (l *List) IndexOf(v []byte) (int, error) {
	if i, ok := l.Index(v); ok {
		return i, nil
	}
	return 0, fmt.Errorf("%w: list.index(x): x not in list", ErrValue)
}

// Remove removes the first item equal to v (by bytes).
func (l *List) Remove(v []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, x := range l.items {
		if bytes.Equal(x, v) {
			l.items = append(l.items[:i], l.items[i+1:]...)
			l.version++
			_ = l.adjust(-ItemCost(x))
			return nil
		}
	}
	return fmt.Errorf("%w: list.remove(x): x not in list", ErrValue)
}

// Count counts the items equal to v (by bytes).
func (l *List) Count(v []byte) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, x := range l.items {
		if bytes.Equal(x, v) {
			n++
		}
	}
	return n
}

// Len returns the number of items.
func (l *List) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.items)
}

// Snapshot returns a copy of the items and the version they belong to.
func (l *List) Snapshot() ([][]byte, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Never nil: an empty list is an empty array on the wire, not nil.
	return append(make([][]byte, 0, len(l.items)), l.items...), l.version
}

// Replace sets all items if the list is still at version (or always when
// version is nil). It reports whether it replaced; over a byte limit it
// fails with ErrLimit and leaves the list as it was.
func (l *List) Replace(items [][]byte, version *uint64) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if version != nil && *version != l.version {
		return false, nil
	}
	if err := l.adjust(itemsCost(items) - l.held); err != nil {
		return false, err
	}
	l.items = items
	l.version++
	return true, nil
}

// Describe implements Object.
func (l *List) Describe() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("%d items", len(l.items)), 0
}

func (l *List) fail(err error) {
	l.mu.Lock()
	l.dead = err
	l.lim.release(l.held) // a deleted list's items are garbage
	l.held = 0
	l.mu.Unlock()
}
