package manager

import (
	"fmt"
	"sync/atomic"
)

// ItemOverhead is what the daemon counts for each stored item or dict entry
// on top of its bytes: the slice header, list element and allocation slack.
// Counting it makes a million 5-byte pickles cost what they really cost in
// memory, not 5 MB.
const ItemOverhead = 64

// ItemCost is the bytes counted against the limits for one stored item.
func ItemCost(b []byte) int64 { return int64(len(b)) + ItemOverhead }

// EntryCost is the bytes counted for one dict entry.
func EntryCost(e DictEntry) int64 { return int64(len(e.Key)+len(e.KeyP)+len(e.Value)) + ItemOverhead }

// byteLimits are the byte budgets objects charge what they store against:
// one per object (perObject) and one shared by the whole manager (total).
// A charge that would pass either fails with ErrLimit and changes nothing.
type byteLimits struct {
	perObject int64 // <= 0: none
	total     int64 // <= 0: none
	used      atomic.Int64
}

// charge takes n bytes for an object that already holds held bytes.
func (l *byteLimits) charge(held, n int64) error {
	if l == nil || n <= 0 {
		return nil
	}
	if l.perObject > 0 && held+n > l.perObject {
		return fmt.Errorf("%w: the object would hold %d bytes, over the server's limit of %d per object (--max-object-bytes)", ErrLimit, held+n, l.perObject)
	}
	for {
		u := l.used.Load()
		if l.total > 0 && u+n > l.total {
			return fmt.Errorf("%w: the server would hold %d bytes of items, over its limit of %d (--max-bytes)", ErrLimit, u+n, l.total)
		}
		if l.used.CompareAndSwap(u, u+n) {
			return nil
		}
	}
}

// force takes n bytes whatever the limits say: the undo of a removal must
// not fail.
func (l *byteLimits) force(n int64) {
	if l != nil {
		l.used.Add(n)
	}
}

// release gives n bytes back.
func (l *byteLimits) release(n int64) {
	if l != nil && n != 0 {
		l.used.Add(-n)
	}
}

// UsedBytes returns the bytes stored in queues, dicts and lists (items,
// entries and the items of waiting putters, each with ItemOverhead).
func (m *Manager) UsedBytes() int64 { return m.bytes.used.Load() }

// room fails with ErrLimit when n more counted bytes would not fit now. It
// lets a transport refuse a large batch before it decodes it; the charge
// made when the batch is stored is still the one that counts.
func (l *byteLimits) room(held, n int64) error {
	if l == nil || n <= 0 {
		return nil
	}
	if l.perObject > 0 && held+n > l.perObject {
		return fmt.Errorf("%w: the object would hold %d bytes, over the server's limit of %d per object (--max-object-bytes)", ErrLimit, held+n, l.perObject)
	}
	if u := l.used.Load(); l.total > 0 && u+n > l.total {
		return fmt.Errorf("%w: the server would hold %d bytes of items, over its limit of %d (--max-bytes)", ErrLimit, u+n, l.total)
	}
	return nil
}

// Room fails with ErrLimit when adding entries of at most n counted bytes
// would pass a byte limit now (see EntryCost).
func (d *Dict) Room(n int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lim.room(d.held, n)
}

// Room fails with ErrLimit when adding items of n counted bytes would pass
// a byte limit now (see ItemCost).
func (l *List) Room(n int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lim.room(l.held, n)
}
