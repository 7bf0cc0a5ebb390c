package server

import (
	"context"
	"maps"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// Ops of the kinds that complete SyncManager parity: Condition, Barrier,
// JoinableQueue, dict, list and Namespace.
func init() {
	objectOps[manager.KindCondition] = map[string]handler{
		"acquire": opAcquire,
		"release": opRelease,
		"wait":    opCondWait,
		"notify": withObj(func(c *conn, cv *manager.Condition, a wire.Args) (any, error) {
			tid, n, err := tidAnd(a, "n", 1)
			if err != nil {
				return nil, err
			}
			return nil, cv.Notify(c.sess, tid, int(n))
		}),
		"notify_all": withObj(func(c *conn, cv *manager.Condition, a wire.Args) (any, error) {
			tid, _, err := tidAnd(a, "", 0)
			if err != nil {
				return nil, err
			}
			return nil, cv.NotifyAll(c.sess, tid)
		}),
	}

	objectOps[manager.KindBarrier] = map[string]handler{
		"wait": opBarrierWait,
		"action_done": withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) {
			ok, err := a.Bool("ok", true)
			if err != nil {
				return nil, err
			}
			return nil, b.ActionDone(c.sess, ok)
		}),
		"abort":     withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { b.Abort(); return nil, nil }),
		"reset":     withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { b.Reset(); return nil, nil }),
		"parties":   withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { return b.Parties(), nil }),
		"n_waiting": withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { return b.NWaiting(), nil }),
		"broken":    withObj(func(c *conn, b *manager.Barrier, a wire.Args) (any, error) { return b.Broken(), nil }),
	}

	jq := maps.Clone(objectOps[manager.KindQueue])
	jq["task_done"] = withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return nil, q.TaskDone() })
	jq["unfinished"] = withObj(func(c *conn, q *manager.Queue, a wire.Args) (any, error) { return q.Unfinished(), nil })
	jq["join"] = opJoin
	objectOps[manager.KindJoinableQueue] = jq

	dict := map[string]handler{
		"get": dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
			key, err := a.Bytes("key")
			if err != nil {
				return nil, err
			}
			if e, ok := d.Get(key); ok {
				return e.Value, nil
			}
			return nil, wire.Errorf(wire.CodeKeyError, "key not found")
		}),
		"set": dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
			e, err := dictEntry(a)
			if err != nil {
				return nil, err
			}
			d.Set(e)
			return nil, nil
		}),
		"setdefault": dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
			e, err := dictEntry(a)
			if err != nil {
				return nil, err
			}
			return d.SetDefault(e).Value, nil
		}),
		"del": dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
			_, err := dictPop(d, a)
			return nil, err
		}),
		"pop": dictOp(dictPop),
		"popitem": dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
			e, ok := d.PopItem()
			if !ok {
				return nil, wire.Errorf(wire.CodeKeyError, "popitem(): dictionary is empty")
			}
			return []any{e.KeyP, e.Value}, nil
		}),
		"contains": dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
			key, err := a.Bytes("key")
			if err != nil {
				return nil, err
			}
			_, ok := d.Get(key)
			return ok, nil
		}),
		"len":   dictOp(func(d *manager.Dict, a wire.Args) (any, error) { return d.Len(), nil }),
		"clear": dictOp(func(d *manager.Dict, a wire.Args) (any, error) { d.Clear(); return nil, nil }),
		"update": dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
			raw, err := a.Bytes("items")
			if err != nil {
				return nil, err
			}
			var triples [][][]byte
			if err := wire.Unmarshal(raw, &triples); err != nil { // checks declared sizes first
				return nil, wire.Errorf(wire.CodeBadRequest, "items must be a msgpack array of [key, key_pickle, value] bins")
			}
			es := make([]manager.DictEntry, len(triples))
			for i, t := range triples {
				if len(t) != 3 || t[0] == nil {
					return nil, wire.Errorf(wire.CodeBadRequest, "item %d must be [key, key_pickle, value]", i)
				}
				es[i] = manager.DictEntry{Key: t[0], KeyP: t[1], Value: t[2]}
			}
			d.Update(es)
			return nil, nil
		}),
		"items": dictOp(func(d *manager.Dict, a wire.Args) (any, error) {
			snap := d.Snapshot()
			out := make([]any, len(snap))
			for i, e := range snap {
				out[i] = []any{e.KeyP, e.Value}
			}
			return out, nil
		}),
	}
	objectOps[manager.KindDict] = dict
	objectOps[manager.KindNamespace] = dict

	objectOps[manager.KindList] = map[string]handler{
		"getitem": listOp(func(l *manager.List, a wire.Args) (any, error) {
			i, err := a.Int("index", 0)
			if err != nil {
				return nil, err
			}
			return l.GetItem(i)
		}),
		"setitem": listOp(func(l *manager.List, a wire.Args) (any, error) {
			i, err := a.Int("index", 0)
			if err != nil {
				return nil, err
			}
			v, err := a.Bytes("value")
			if err != nil {
				return nil, err
			}
			return nil, l.SetItem(i, v)
		}),
		"delitem": listOp(func(l *manager.List, a wire.Args) (any, error) {
			i, err := a.Int("index", 0)
			if err != nil {
				return nil, err
			}
			return nil, l.DelItem(i)
		}),
		"pop": listOp(func(l *manager.List, a wire.Args) (any, error) {
			i, err := a.Int("index", -1)
			if err != nil {
				return nil, err
			}
			return l.Pop(i)
		}),
		"append": listOp(func(l *manager.List, a wire.Args) (any, error) {
			v, err := a.Bytes("value")
			if err != nil {
				return nil, err
			}
			l.Extend(v)
			return nil, nil
		}),
		"extend": listOp(func(l *manager.List, a wire.Args) (any, error) {
			items, err := binList(a)
			if err != nil {
				return nil, err
			}
			l.Extend(items...)
			return nil, nil
		}),
		"insert": listOp(func(l *manager.List, a wire.Args) (any, error) {
			i, err := a.Int("index", 0)
			if err != nil {
				return nil, err
			}
			v, err := a.Bytes("value")
			if err != nil {
				return nil, err
			}
			l.Insert(i, v)
			return nil, nil
		}),
		"remove": listOp(func(l *manager.List, a wire.Args) (any, error) {
			v, err := a.Bytes("value")
			if err != nil {
				return nil, err
			}
			return nil, l.Remove(v)
		}),
		"index": listOp(func(l *manager.List, a wire.Args) (any, error) {
			v, err := a.Bytes("value")
			if err != nil {
				return nil, err
			}
			if i, ok := l.Index(v); ok {
				return i, nil
			}
			return nil, wire.Errorf(wire.CodeValueError, "list.index(x): x not in list")
		}),
		"count": listOp(func(l *manager.List, a wire.Args) (any, error) {
			v, err := a.Bytes("value")
			if err != nil {
				return nil, err
			}
			return l.Count(v), nil
		}),
		"len": listOp(func(l *manager.List, a wire.Args) (any, error) { return l.Len(), nil }),
		"snapshot": listOp(func(l *manager.List, a wire.Args) (any, error) {
			items, version := l.Snapshot()
			return map[string]any{"items": items, "version": version}, nil
		}),
		"replace": listOp(func(l *manager.List, a wire.Args) (any, error) {
			items, err := binList(a)
			if err != nil {
				return nil, err
			}
			var version *uint64
			if a["version"] != nil {
				v, err := a.Uint("version", 0)
				if err != nil {
					return nil, err
				}
				version = &v
			}
			return l.Replace(items, version), nil
		}),
	}
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
	if e.Key, err = a.Bytes("key"); err != nil {
		return e, err
	}
	if e.KeyP, err = a.Bytes("kp"); err != nil {
		return e, err
	}
	e.Value, err = a.Bytes("value")
	return e, err
}

func dictPop(d *manager.Dict, a wire.Args) (any, error) {
	key, err := a.Bytes("key")
	if err != nil {
		return nil, err
	}
	e, ok := d.Delete(key)
	if !ok {
		return nil, wire.Errorf(wire.CodeKeyError, "key not found")
	}
	return e.Value, nil
}

// binList decodes the "items" argument: a msgpack array of bins carried as
// one bin, so that requests stay flat.
func binList(a wire.Args) ([][]byte, error) {
	raw, err := a.Bytes("items")
	if err != nil {
		return nil, err
	}
	var items [][]byte
	if err := wire.Unmarshal(raw, &items); err != nil { // checks declared sizes first
		return nil, wire.Errorf(wire.CodeBadRequest, "items must be a msgpack array of bins")
	}
	for i, it := range items {
		if it == nil {
			return nil, wire.Errorf(wire.CodeBadRequest, "item %d must be bin", i)
		}
	}
	return items, nil
}

func tidAnd(a wire.Args, key string, def int64) (tid, n int64, err error) {
	if tid, err = a.Int("tid", 0); err != nil || key == "" {
		return
	}
	n, err = a.Int(key, def)
	return
}

func opCondWait(c *conn, id uint64, a wire.Args) (any, error) {
	cv, err := lookup[*manager.Condition](c, a)
	if err != nil {
		return nil, err
	}
	tid, err := a.Int("tid", 0)
	if err != nil {
		return nil, err
	}
	_, timeout, err := blocking(a)
	if err != nil {
		return nil, err
	}
	return nil, c.park(id, func(ctx context.Context) (any, error) { return cv.Wait(ctx, c.sess, tid, timeout) }, nil)
}

func opBarrierWait(c *conn, id uint64, a wire.Args) (any, error) {
	b, err := lookup[*manager.Barrier](c, a)
	if err != nil {
		return nil, err
	}
	_, timeout, err := blocking(a)
	if err != nil {
		return nil, err
	}
	return nil, c.park(id, func(ctx context.Context) (any, error) {
		idx, action, err := b.Wait(ctx, c.sess, timeout)
		if err != nil {
			return nil, err
		}
		return map[string]any{"index": idx, "action": action}, nil
	}, nil)
}

func opJoin(c *conn, id uint64, a wire.Args) (any, error) {
	q, err := lookup[*manager.Queue](c, a)
	if err != nil {
		return nil, err
	}
	_, timeout, err := blocking(a)
	if err != nil {
		return nil, err
	}
	if q.Unfinished() == 0 || timeout == 0 {
		return q.Join(c.ctx, 0)
	}
	return nil, c.park(id, func(ctx context.Context) (any, error) { return q.Join(ctx, timeout) }, nil)
}
