package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

// Handle is what every object handle has: its client, kind and name.
type Handle struct {
	c    *Client
	kind string
	name string
	anon bool
	fw   *fastWord            // the object's words on the fast path; nil: socket only
	qr   *statemem.ClientRing // a Queue's ring (queue_fast.go); nil: socket only
}

// Name returns the object's name (generated for anonymous objects).
func (h *Handle) Name() string { return h.name }

// Kind returns the object's wire kind.
func (h *Handle) Kind() string { return h.kind }

// Close drops this client's reference to an anonymous object, which the
// server deletes when no client references it. It is a no-op for named
// objects, which live until deleted.
func (h *Handle) Close() error {
	if !h.anon {
		return nil
	}
	return h.c.Notify(wire.OpDecref, map[string]any{wire.ArgName: h.name})
}

func (h *Handle) args(kv ...any) map[string]any {
	m := map[string]any{wire.ArgKind: h.kind, wire.ArgName: h.name}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func (h *Handle) call(ctx context.Context, op string, undo func(any), kv ...any) (any, error) {
	return h.c.Call(ctx, op, h.args(kv...), undo)
}

func (c *Client) create(ctx context.Context, kind, name string, kv ...any) (Handle, error) {
	args := map[string]any{wire.ArgKind: kind}
	if name != "" {
		args[wire.ArgName] = name
	}
	for i := 0; i+1 < len(kv); i += 2 {
		args[kv[i].(string)] = kv[i+1]
	}
	if c.fast != nil && wordKind(kind) {
		args[wire.ArgFastpath] = true // the reply carries the object's word: one round trip
	}
	res, err := c.Call(ctx, wire.OpCreate, args, nil)
	if err != nil {
		return Handle{}, err
	}
	m, ok := res.(map[string]any)
	got, _ := m["name"].(string)
	if !ok || got == "" {
		return Handle{}, fmt.Errorf("syncmgr: create: unexpected reply %v", res)
	}
	h := Handle{c: c, kind: kind, name: got, anon: name == ""}
	h.fw = c.fastRef(ctx, h, m["fp"])
	h.qr = c.queueRef(h)
	return h, nil
}

// timeoutArgs turns ctx's deadline into the server-side timeout, so a call
// with a deadline ends on the server without a cancel round trip.
func timeoutArgs(ctx context.Context) []any {
	if dl, ok := ctx.Deadline(); ok {
		return []any{wire.ArgTimeout, max(time.Until(dl).Seconds(), 0)}
	}
	return nil
}

func toInt(x any) (int, bool) {
	switch v := x.(type) {
	case int64:
		return int(v), true
	case uint64:
		return int(v), true
	}
	return 0, false
}
