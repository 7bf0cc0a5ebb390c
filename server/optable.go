package server

import (
	"context"
	"fmt"
	"time"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// The op table: every op the daemon serves, built explicitly by newOpTable
// from one function per family (ops_admin.go, ops_sync.go, ops_queue.go,
// ops_containers.go, ops_shm.go). An op's semantics live in package
// manager; here is only its wire form: which arguments it reads and what it
// replies.

// handler executes a request that makes no grant.
type handler func(c *conn, id uint64, a wire.Args) (any, error)

// granter executes a blocking or consuming request. It returns the reply
// and the grant the reply carries, which the connection commits once the
// reply is written or undoes when it is not (see conn.deliver); or
// errParked when it has arranged to reply later (see conn.park).
type granter func(c *conn, id uint64, a wire.Args) (any, manager.Grant, error)

// op is one entry of the table: exactly one of fn and grant is set.
type op struct {
	family string
	name   string // the op's name, for metrics and status
	kind   string // the kind it is entered under, "server" for server ops
	fn     handler
	grant  granter
}

// opTable maps op names to ops: server ops address no object, object ops
// are keyed by kind, then op.
type opTable struct {
	server map[string]*op
	object map[string]map[string]*op
	named  map[string]bool // every object op name, to tell it from an unknown op
}

// newOpTable builds the table. A duplicate (the same op twice for a kind, or
// a server op also defined for a kind) panics: it is a bug caught by any test
// that starts a server.
func newOpTable() *opTable {
	t := &opTable{server: map[string]*op{}, object: map[string]map[string]*op{}, named: map[string]bool{}}
	adminOps(t)
	syncOps(t)
	queueOps(t)
	containerOps(t)
	shmOps(t)
	fastpathOps(t)
	for name := range t.server {
		if t.named[name] {
			panic(fmt.Sprintf("op table: %q is both a server op and an object op", name))
		}
	}
	return t
}

// serverOp adds an op that addresses no object.
func (t *opTable) serverOp(family, name string, fn handler) {
	if _, dup := t.server[name]; dup {
		panic(fmt.Sprintf("op table: server op %q defined twice", name))
	}
	t.server[name] = &op{family: family, name: name, kind: "server", fn: fn}
}

// objectOp adds an op to each of kinds; exactly one of fn and g is set.
func (t *opTable) objectOp(family string, kinds []string, name string, fn handler, g granter) {
	if (fn == nil) == (g == nil) {
		panic(fmt.Sprintf("op table: %q needs exactly one of handler and granter", name))
	}
	for _, k := range kinds {
		ops := t.object[k]
		if ops == nil {
			ops = map[string]*op{}
			t.object[k] = ops
		}
		if _, dup := ops[name]; dup {
			panic(fmt.Sprintf("op table: op %q of kind %q defined twice", name, k))
		}
		ops[name] = &op{family: family, name: name, kind: k, fn: fn, grant: g}
	}
	t.named[name] = true
}

// find returns the op a request names, or the error to answer.
func (t *opTable) find(req *wire.Request) (*op, error) {
	if o, ok := t.server[req.Op]; ok {
		return o, nil
	}
	kind, err := req.Args.String(wire.ArgKind)
	if err != nil {
		if !t.named[req.Op] {
			return nil, wire.Errorf(wire.CodeUnknownOp, "unknown op %q", req.Op)
		}
		return nil, err
	}
	ops, ok := t.object[kind]
	if !ok {
		return nil, fmt.Errorf("%w %q", manager.ErrUnknownKind, kind)
	}
	o, ok := ops[req.Op]
	if !ok {
		return nil, wire.Errorf(wire.CodeUnknownOp, "%q is not an op of a %s", req.Op, kind)
	}
	return o, nil
}

// Kind groups of the op table.
var (
	acquirerKinds = []string{wire.KindLock, wire.KindRLock, wire.KindSemaphore, wire.KindBoundedSemaphore, wire.KindCondition}
	queueKinds    = []string{wire.KindQueue, wire.KindJoinableQueue}
	dictKinds     = []string{wire.KindDict, wire.KindNamespace}
)

// lookup finds the object a request names and asserts its Go type.
func lookup[T any](c *conn, a wire.Args) (T, error) {
	var zero T
	kind, err := a.String(wire.ArgKind)
	if err != nil {
		return zero, err
	}
	name, err := a.String(wire.ArgName)
	if err != nil {
		return zero, err
	}
	obj, err := c.srv.mgr.Lookup(manager.Kind(kind), name)
	if err != nil {
		return zero, err
	}
	t, ok := obj.(T)
	if !ok {
		return zero, wire.Errorf(wire.CodeUnknownOp, "op not supported by a %s", kind)
	}
	return t, nil
}

// withObj makes a handler of fn, looking up the object first.
func withObj[T any](fn func(c *conn, obj T, a wire.Args) (any, error)) handler {
	return func(c *conn, _ uint64, a wire.Args) (any, error) {
		obj, err := lookup[T](c, a)
		if err != nil {
			return nil, err
		}
		return fn(c, obj, a)
	}
}

// blocking reads the block and timeout arguments.
func blocking(a wire.Args) (block bool, timeout time.Duration, err error) {
	if block, err = a.Bool(wire.ArgBlock, true); err != nil {
		return
	}
	secs, ok, err := a.Timeout()
	if err != nil {
		return
	}
	timeout = manager.Forever
	if ok && secs < 1e9 {
		timeout = time.Duration(secs * float64(time.Second))
	}
	return
}

// waitFunc is the blocking part of a parked request.
type waitFunc func(ctx context.Context) (any, manager.Grant, error)
