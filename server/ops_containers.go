package server

import (
	"bytes"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// containerOps: dict, Namespace (a dict) and list. Keys, values and items
// are opaque bins (pickles); the daemon compares them as bytes.
func containerOps(t *opTable) {
	const f = "containers"
	t.objectOp(f, dictKinds, wire.OpGet, dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
		key, err := a.Bytes(wire.ArgKey)
		if err != nil {
			return nil, err
		}
		return d.Value(key)
	}), nil)
	t.objectOp(f, dictKinds, wire.OpSet, dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
		e, err := dictEntry(a)
		if err != nil {
			return nil, err
		}
		return nil, d.Set(e)
	}), nil)
	t.objectOp(f, dictKinds, wire.OpSetDefault, dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
		e, err := dictEntry(a)
		if err != nil {
			return nil, err
		}
		got, err := d.SetDefault(e)
		return got.Value, err
	}), nil)
	t.objectOp(f, dictKinds, wire.OpDel, dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
		_, err := dictPop(d, a)
		return nil, err
	}), nil)
	t.objectOp(f, dictKinds, wire.OpPop, dictOp(dictPop), nil)
	t.objectOp(f, dictKinds, wire.OpPopItem, dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
		e, err := d.PopLast()
		if err != nil {
			return nil, err
		}
		return []any{e.KeyP, e.Value}, nil
	}), nil)
	t.objectOp(f, dictKinds, wire.OpContains, dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
		key, err := a.Bytes(wire.ArgKey)
		if err != nil {
			return nil, err
		}
		_, ok := d.Get(key)
		return ok, nil
	}), nil)
	t.objectOp(f, dictKinds, wire.OpLen, dictOp(func(d *manager.Dict, a wire.Args) (any, error) { return d.Len(), nil }), nil)
	t.objectOp(f, dictKinds, wire.OpClear, dictOp(func(d *manager.Dict, a wire.Args) (any, error) { d.Clear(); return nil, nil }), nil)
	t.objectOp(f, dictKinds, wire.OpUpdate, dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
		raw, err := a.Bytes(wire.ArgItems)
		if err != nil {
			return nil, err
		}
		if err := d.Room(batchCost(raw)); err != nil { // refuse before decoding
			return nil, err
		}
		bins, err := wire.BinTuples(raw, 3)
		if err != nil {
			return nil, wire.Errorf(wire.CodeBadRequest, "items must be a msgpack array of [key, key_pickle, value] bins: %v", err)
		}
		cloneAll(bins)
		es := make([]manager.DictEntry, len(bins)/3)
		for i := range es {
			es[i] = manager.DictEntry{Key: bins[3*i], KeyP: bins[3*i+1], Value: bins[3*i+2]}
		}
		return nil, d.Update(es)
	}), nil)
	t.objectOp(f, dictKinds, wire.OpItems, dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
		snap := d.Snapshot()
		out := make([]any, len(snap))
		for i, e := range snap {
			out[i] = []any{e.KeyP, e.Value}
		}
		return out, nil
	}), nil)

	list := []string{wire.KindList}
	t.objectOp(f, list, wire.OpGetItem, listOp(func(l *manager.List, a wire.Args) (any, error) {
		i, err := a.Int(wire.ArgIndex, 0)
		if err != nil {
			return nil, err
		}
		return l.GetItem(i)
	}), nil)
	t.objectOp(f, list, wire.OpSetItem, listOp(func(l *manager.List, a wire.Args) (any, error) {
		i, err := a.Int(wire.ArgIndex, 0)
		if err != nil {
			return nil, err
		}
		v, err := a.Bytes(wire.ArgValue)
		if err != nil {
			return nil, err
		}
		return nil, l.SetItem(i, v)
	}), nil)
	t.objectOp(f, list, wire.OpDelItem, listOp(func(l *manager.List, a wire.Args) (any, error) {
		i, err := a.Int(wire.ArgIndex, 0)
		if err != nil {
			return nil, err
		}
		return nil, l.DelItem(i)
	}), nil)
	t.objectOp(f, list, wire.OpPop, listOp(func(l *manager.List, a wire.Args) (any, error) {
		i, err := a.Int(wire.ArgIndex, -1)
		if err != nil {
			return nil, err
		}
		return l.Pop(i)
	}), nil)
	t.objectOp(f, list, wire.OpAppend, listOp(func(l *manager.List, a wire.Args) (any, error) {
		v, err := a.Bytes(wire.ArgValue)
		if err != nil {
			return nil, err
		}
		return nil, l.Extend(v)
	}), nil)
	t.objectOp(f, list, wire.OpExtend, listOp(func(l *manager.List, a wire.Args) (any, error) {
		raw, err := a.Bytes(wire.ArgItems)
		if err != nil {
			return nil, err
		}
		if err := l.Room(batchCost(raw)); err != nil { // refuse before decoding
			return nil, err
		}
		items, err := binList(a)
		if err != nil {
			return nil, err
		}
		return nil, l.Extend(items...)
	}), nil)
	t.objectOp(f, list, wire.OpInsert, listOp(func(l *manager.List, a wire.Args) (any, error) {
		i, err := a.Int(wire.ArgIndex, 0)
		if err != nil {
			return nil, err
		}
		v, err := a.Bytes(wire.ArgValue)
		if err != nil {
			return nil, err
		}
		return nil, l.Insert(i, v)
	}), nil)
	t.objectOp(f, list, wire.OpRemove, listOp(func(l *manager.List, a wire.Args) (any, error) {
		v, err := a.Bytes(wire.ArgValue)
		if err != nil {
			return nil, err
		}
		return nil, l.Remove(v)
	}), nil)
	t.objectOp(f, list, wire.OpIndex, listOp(func(l *manager.List, a wire.Args) (any, error) {
		v, err := a.Bytes(wire.ArgValue)
		if err != nil {
			return nil, err
		}
		return l.IndexOf(v)
	}), nil)
	t.objectOp(f, list, wire.OpCount, listOp(func(l *manager.List, a wire.Args) (any, error) {
		v, err := a.Bytes(wire.ArgValue)
		if err != nil {
			return nil, err
		}
		return l.Count(v), nil
	}), nil)
	t.objectOp(f, list, wire.OpLen, listOp(func(l *manager.List, a wire.Args) (any, error) { return l.Len(), nil }), nil)
	t.objectOp(f, list, wire.OpSnapshot, listOp(func(l *manager.List, a wire.Args) (any, error) {
		items, version := l.Snapshot()
		return map[string]any{"items": items, "version": version}, nil
	}), nil)
	t.objectOp(f, list, wire.OpReplace, listOp(func(l *manager.List, a wire.Args) (any, error) {
		items, err := binList(a)
		if err != nil {
			return nil, err
		}
		var version *uint64
		if a.Get(wire.ArgVersion) != nil {
			v, err := a.Uint(wire.ArgVersion, 0)
			if err != nil {
				return nil, err
			}
			version = &v
		}
		return l.Replace(items, version)
	}), nil)
}

func dictOp(fn func(d *manager.Dict, a wire.Args) (any, error)) handler {
	return withObj(func(c *conn, d *manager.Dict, a wire.Args) (any, error) { return fn(d, a) })
}

func listOp(fn func(l *manager.List, a wire.Args) (any, error)) handler {
	return withObj(func(c *conn, l *manager.List, a wire.Args) (any, error) { return fn(l, a) })
}

func dictEntry(a wire.Args) (manager.DictEntry, error) {
	var e manager.DictEntry
	var err error
	if e.Key, err = a.Bytes(wire.ArgKey); err != nil {
		return e, err
	}
	if e.KeyP, err = a.Bytes(wire.ArgKeyP); err != nil {
		return e, err
	}
	// The key outlives any value later stored under it: copied, it does not
	// keep this request's frame (and the value in it) alive after a
	// replacement. The value stays a slice of the frame, which it nearly fills.
	e.Key, e.KeyP = bytes.Clone(e.Key), bytes.Clone(e.KeyP)
	e.Value, err = a.Bytes(wire.ArgValue)
	return e, err
}

// cloneAll copies each bin out of the frame it was decoded from. Items of a
// batch are stored and removed one by one, so a slice of the frame kept by
// one small survivor would keep the whole frame alive, uncounted.
func cloneAll(bins [][]byte) {
	for i, b := range bins {
		bins[i] = bytes.Clone(b)
	}
}

func dictPop(d *manager.Dict, a wire.Args) (any, error) {
	key, err := a.Bytes(wire.ArgKey)
	if err != nil {
		return nil, err
	}
	return d.Pop(key)
}

// batchCost is at least what storing the items of raw (a msgpack array)
// would count: its bytes and ItemOverhead per element.
func batchCost(raw []byte) int64 {
	n, err := wire.ArrayLen(raw)
	if err != nil {
		return 0 // the decoder will refuse it
	}
	return int64(len(raw)) + int64(n)*manager.ItemOverhead
}

// binList decodes the "items" argument: a msgpack array of bins carried as
// one bin, so that requests stay flat.
func binList(a wire.Args) ([][]byte, error) {
	raw, err := a.Bytes(wire.ArgItems)
	if err != nil {
		return nil, err
	}
	items, err := wire.BinTuples(raw, 1)
	if err != nil {
		return nil, wire.Errorf(wire.CodeBadRequest, "items must be a msgpack array of bins: %v", err)
	}
	cloneAll(items)
	return items, nil
}
