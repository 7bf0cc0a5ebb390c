package server_test

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

// step is one request and what it must answer.
type step struct {
	op   string
	args map[string]any
	want any       // the result, when code is ""
	code wire.Code // the expected error code
}

// any_ in want accepts any result.
type anyResult struct{}

var any_ = anyResult{}

func runSteps(t *testing.T, steps []step, call func(op string, args map[string]any) (any, error)) {
	t.Helper()
	for i, s := range steps {
		res, err := call(s.op, s.args)
		name := fmt.Sprintf("step %d: %s %v", i, s.op, s.args)
		if s.code != "" {
			if code(err) != s.code {
				t.Errorf("%s: got %v, %v; want code %s", name, res, err, s.code)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if s.want != any_ && !reflect.DeepEqual(res, s.want) {
			t.Errorf("%s: got %#v, want %#v", name, res, s.want)
		}
	}
}

func created(name string, c bool) map[string]any { return map[string]any{"name": name, "created": c} }

// TestEveryOp runs every op of every core kind through the real transport,
// with its error cases.
func TestEveryOp(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t)
	ctx := ctxT(t)
	do := func(op string, args map[string]any) (any, error) { return c.Call(ctx, op, args, nil) }
	L, R, S, B := obj("lock", "L"), obj("rlock", "R"), obj("semaphore", "S"), obj("bounded_semaphore", "B")
	E, V, Q := obj("event", "E"), obj("value", "V"), obj("queue", "Q")
	with := func(base map[string]any, kv ...any) map[string]any {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	steps := []step{
		{op: "ping", want: nil},
		{op: "ping", args: map[string]any{"ignored": 1}, want: nil},

		// create and the registry.
		{op: "create", args: L, want: created("L", true)},
		{op: "create", args: L, want: created("L", false)},
		{op: "create", args: obj("rlock", "L"), code: wire.CodeKindMismatch},
		{op: "create", args: obj("lock", "a/b"), code: wire.CodeBadName},
		{op: "create", args: obj("lock", ".."), code: wire.CodeBadName},
		{op: "create", args: obj("lock", "a\x00b"), code: wire.CodeBadName},
		{op: "create", args: obj("lock", strings.Repeat("n", 10<<10)), code: wire.CodeBadName},
		{op: "create", args: obj("lock", "anon-lock-x"), code: wire.CodeBadName},
		{op: "create", args: map[string]any{"kind": "lock", "name": 5}, code: wire.CodeBadRequest},
		{op: "create", args: map[string]any{"name": "x"}, code: wire.CodeBadRequest},
		{op: "create", args: map[string]any{"kind": 1, "name": "x"}, code: wire.CodeBadRequest},
		{op: "create", args: obj("widget", "w"), code: wire.CodeBadRequest},

		// lock
		{op: "acquire", args: with(L, "tid", 1), want: true},
		{op: "acquire", args: with(L, "tid", 1, "block", false), want: false},
		{op: "acquire", args: with(L, "tid", 2, "timeout", 0), want: false},
		{op: "acquire", args: with(L, "tid", 2, "timeout", 0.02), want: false},
		{op: "acquire", args: with(L, "timeout", -1), code: wire.CodeValueError},
		{op: "acquire", args: with(L, "timeout", math.NaN()), code: wire.CodeValueError},
		{op: "acquire", args: with(L, "timeout", math.Inf(1)), code: wire.CodeValueError},
		{op: "acquire", args: with(L, "timeout", "1"), code: wire.CodeBadRequest},
		{op: "acquire", args: with(L, "block", "yes"), code: wire.CodeBadRequest},
		{op: "acquire", args: with(L, "tid", "x"), code: wire.CodeBadRequest},
		{op: "acquire", args: with(L, "tid", uint64(math.MaxUint64)), code: wire.CodeValueError},
		{op: "release", args: with(L, "tid", 9), want: nil}, // any thread may release a lock
		{op: "release", args: L, code: wire.CodeNotOwner},
		{op: "acquire", args: obj("lock", "missing"), code: wire.CodeNoSuchObject},
		{op: "acquire", args: map[string]any{"kind": "lock"}, code: wire.CodeBadRequest},
		{op: "get", args: L, code: wire.CodeUnknownOp},

		// rlock
		{op: "create", args: R, want: created("R", true)},
		{op: "acquire", args: with(R, "tid", 1), want: true},
		{op: "acquire", args: with(R, "tid", 1), want: true},
		{op: "acquire", args: with(R, "tid", 2, "block", false), want: false},
		{op: "release", args: with(R, "tid", 2), code: wire.CodeNotOwner},
		{op: "release", args: with(R, "tid", 1), want: nil},
		{op: "release", args: with(R, "tid", 1), want: nil},
		{op: "release", args: with(R, "tid", 1), code: wire.CodeNotOwner},

		// semaphore and bounded semaphore
		{op: "create", args: with(S, "value", 2), want: created("S", true)},
		{op: "acquire", args: S, want: true},
		{op: "acquire", args: S, want: true},
		{op: "acquire", args: with(S, "block", false), want: false},
		{op: "release", args: S, want: nil},
		{op: "release", args: S, want: nil},
		{op: "release", args: S, want: nil}, // above the initial value is allowed
		{op: "create", args: with(obj("semaphore", "S2"), "value", -1), code: wire.CodeValueError},
		{op: "create", args: with(obj("semaphore", "S2"), "value", "x"), code: wire.CodeBadRequest},
		{op: "create", args: with(B, "value", 1), want: created("B", true)},
		{op: "release", args: B, code: wire.CodeValueError},
		{op: "acquire", args: B, want: true},
		{op: "release", args: B, want: nil},

		// event
		{op: "create", args: E, want: created("E", true)},
		{op: "is_set", args: E, want: false},
		{op: "wait", args: with(E, "timeout", 0), want: false},
		{op: "wait", args: with(E, "timeout", 0.02), want: false},
		{op: "wait", args: with(E, "timeout", -0.5), code: wire.CodeValueError},
		{op: "set", args: E, want: nil},
		{op: "is_set", args: E, want: true},
		{op: "wait", args: E, want: true},
		{op: "clear", args: E, want: nil},
		{op: "is_set", args: E, want: false},
		{op: "acquire", args: E, code: wire.CodeUnknownOp},

		// value
		{op: "create", args: with(V, "typecode", "i", "value", 5), want: created("V", true)},
		{op: "get", args: V, want: int64(5)},
		{op: "set", args: with(V, "value", 7), want: nil},
		{op: "add", args: with(V, "delta", 3), want: int64(10)},
		{op: "add", args: with(V, "delta", int64(math.MaxInt32)), want: int64(math.MinInt32 + 9)},
		{op: "set", args: with(V, "value", int64(1)<<40), code: wire.CodeValueError},
		{op: "set", args: with(V, "value", "x"), code: wire.CodeTypeError},
		{op: "set", args: V, code: wire.CodeTypeError},
		{op: "add", args: with(V, "delta", 1.5), code: wire.CodeTypeError},
		{op: "set", args: with(V, "value", 10), want: nil},
		{op: "cas", args: with(V, "expected", 10, "new", 11), want: true},
		{op: "cas", args: with(V, "expected", 10, "new", 12), want: false},
		{op: "get", args: V, want: int64(11)},
		{op: "create", args: with(obj("value", "F"), "typecode", "f", "value", 0.1), want: created("F", true)},
		{op: "get", args: obj("value", "F"), want: float64(float32(0.1))},
		{op: "create", args: with(obj("value", "C"), "typecode", "c", "value", []byte("x")), want: created("C", true)},
		{op: "get", args: obj("value", "C"), want: []byte("x")},
		{op: "create", args: with(obj("value", "U"), "typecode", "Q", "value", uint64(math.MaxUint64)), want: created("U", true)},
		{op: "get", args: obj("value", "U"), want: uint64(math.MaxUint64)},
		{op: "add", args: with(obj("value", "U"), "delta", 1), want: int64(0)},
		{op: "create", args: with(obj("value", "X"), "typecode", "zz"), code: wire.CodeValueError},
		{op: "create", args: obj("value", "X"), code: wire.CodeBadRequest},
		{op: "create", args: with(obj("value", "X"), "typecode", "b", "value", 300), code: wire.CodeValueError},

		// queue
		{op: "create", args: with(Q, "maxsize", 2), want: created("Q", true)},
		{op: "empty", args: Q, want: true},
		{op: "put", args: with(Q, "item", []byte("a")), want: nil},
		{op: "put", args: with(Q, "item", []byte("b")), want: nil},
		{op: "full", args: Q, want: true},
		{op: "qsize", args: Q, want: int64(2)},
		{op: "put", args: with(Q, "item", []byte("c"), "block", false), code: wire.CodeFull},
		{op: "put", args: with(Q, "item", []byte("c"), "timeout", 0.02), code: wire.CodeFull},
		{op: "put", args: with(Q, "item", "str"), code: wire.CodeBadRequest},
		{op: "put", args: Q, code: wire.CodeBadRequest},
		{op: "get", args: Q, want: []byte("a")},
		{op: "unget", args: with(Q, "item", []byte("z")), want: nil},
		{op: "get", args: Q, want: []byte("z")},
		{op: "get", args: Q, want: []byte("b")},
		{op: "empty", args: Q, want: true},
		{op: "full", args: Q, want: false},
		{op: "get", args: with(Q, "block", false), code: wire.CodeEmpty},
		{op: "get", args: with(Q, "timeout", 0.02), code: wire.CodeEmpty},
		{op: "get", args: with(Q, "timeout", math.NaN()), code: wire.CodeValueError},
		{op: "create", args: with(obj("queue", "Huge"), "maxsize", int64(1)<<40), code: wire.CodeValueError},
		{op: "create", args: with(obj("queue", "Neg"), "maxsize", -1), want: created("Neg", true)},
		{op: "acquire", args: Q, code: wire.CodeUnknownOp},

		// server ops
		{op: "frobnicate", code: wire.CodeUnknownOp},
		{op: "", code: wire.CodeUnknownOp},
		{op: "acquire", args: obj("widget", "L"), code: wire.CodeBadRequest},
		{op: "incref", args: map[string]any{"name": "L"}, want: nil},
		{op: "decref", args: map[string]any{"name": "L"}, want: nil},
		{op: "share", args: map[string]any{"name": "L"}, want: nil},
		{op: "incref", args: map[string]any{"name": "missing"}, code: wire.CodeNoSuchObject},
		{op: "share", args: map[string]any{}, code: wire.CodeBadRequest},
		{op: "cancel", args: map[string]any{"id": 12345}, want: nil},
		{op: "cancel", args: map[string]any{"id": -1}, code: wire.CodeValueError},
		{op: "status", want: any_},
		{op: "delete", args: map[string]any{"name": "L"}, want: true},
		{op: "delete", args: map[string]any{"name": "L"}, want: false},
		{op: "delete", args: map[string]any{"name": 3}, code: wire.CodeBadRequest},
		{op: "acquire", args: L, code: wire.CodeNoSuchObject},
		{op: "shm_list", code: wire.CodeUnknownOp}, // no registry in this server
	}
	runSteps(t, steps, do)
}

func TestAnonymousOverTransport(t *testing.T) {
	ts := startServer(t)
	a, b := ts.dial(t), ts.dial(t)
	ctx := ctxT(t)
	res, err := a.Call(ctx, "create", map[string]any{"kind": "queue"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	name, _ := res.(map[string]any)["name"].(string)
	if !strings.HasPrefix(name, "anon-queue-") || len(name) != len("anon-queue-")+32 {
		t.Fatalf("name %q", name)
	}
	if err := b.Notify("incref", map[string]any{"name": name}); err != nil {
		t.Fatal(err)
	}
	call(t, b, "ping", nil) // the incref has been handled
	a.Close()
	ts.waitSessions(t, 1)
	if _, err := ts.srv.Manager().Lookup("queue", name); err != nil {
		t.Fatalf("deleted while b holds a reference: %v", err)
	}
	b.Notify("decref", map[string]any{"name": name})
	call(t, b, "ping", nil)
	if _, err := ts.srv.Manager().Lookup("queue", name); err == nil {
		t.Fatal("not deleted after the last reference")
	}
	// Requests without a reply never answer, even on error.
	if err := b.Notify("decref", map[string]any{"name": "missing"}); err != nil {
		t.Fatal(err)
	}
	call(t, b, "ping", nil)
}

func TestStatusOp(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t, proxy.WithLabel("status-test"))
	call(t, c, "create", obj("lock", "held"))
	call(t, c, "acquire", obj("lock", "held", "tid", 140))
	call(t, c, "create", obj("event", "ev"))
	st := call(t, c, "status", nil).(map[string]any)
	srv := st["server"].(map[string]any)
	if srv["version"] != "0.1.0" || srv["objects"] != int64(2) || srv["sessions"] != int64(1) || srv["connections"] != int64(1) {
		t.Fatalf("server %v", srv)
	}
	objs := st["objects"].([]any)
	if len(objs) != 2 {
		t.Fatalf("objects %v", objs)
	}
	ev, held := objs[0].(map[string]any), objs[1].(map[string]any)
	if ev["name"] != "ev" || ev["state"] != "clear" || held["kind"] != "lock" || !strings.Contains(held["state"].(string), "thread 140") {
		t.Fatalf("objects %v", objs)
	}
	sess := st["sessions"].([]any)[0].(map[string]any)
	if sess["label"] != "status-test" || sess["holds"] != int64(1) || sess["conns"] != int64(1) {
		t.Fatalf("session %v", sess)
	}
	if st := call(t, c, "status", map[string]any{"limit": 1}).(map[string]any); len(st["objects"].([]any)) != 1 ||
		st["server"].(map[string]any)["objects_omitted"] != int64(1) {
		t.Fatalf("limit: %v", st)
	}
}

// TestContainerItemsClaimingHugeSizes: the items bin of dict and list ops is
// decoded with the same size checks as frames.
func TestContainerItemsClaimingHugeSizes(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t)
	call(t, c, "create", obj("dict", "d"))
	call(t, c, "create", obj("list", "l"))
	hostile := [][]byte{
		{0x91, 0x93, 0xc6, 0x7f, 0xff, 0xff, 0xff},            // [[bin claiming 2 GiB ...]]
		{0xdd, 0x7f, 0xff, 0xff, 0xff},                        // array claiming 2 G elements
		{0x91, 0xdd, 0x7f, 0xff, 0xff, 0xff},                  // nested array claiming 2 G elements
		{0x92, 0xc4, 0x01, 'a', 0xc6, 0x7f, 0xff, 0xff, 0xff}, // list items: a bin claiming 2 GiB
	}
	for _, items := range hostile {
		for _, o := range []map[string]any{
			obj("dict", "d", "items", items),
		} {
			start := time.Now()
			if err := callErr(c, "update", o); code(err) != wire.CodeBadRequest {
				t.Fatalf("update %x: %v", items, err)
			}
			if el := time.Since(start); el > time.Second {
				t.Fatalf("update %x took %v", items, el)
			}
		}
		for _, op := range []string{"extend", "replace"} {
			start := time.Now()
			if err := callErr(c, op, obj("list", "l", "items", items)); code(err) != wire.CodeBadRequest {
				t.Fatalf("%s %x: %v", op, items, err)
			}
			if el := time.Since(start); el > time.Second {
				t.Fatalf("%s %x took %v", op, items, el)
			}
		}
	}
	if n := call(t, c, "len", obj("list", "l")); n != int64(0) {
		t.Fatalf("list len %v", n)
	}
}
