package server_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

// parityServer starts a server and returns a dial func.
func parityServer(t *testing.T) func() *proxy.Client {
	ts := startServer(t)
	return func() *proxy.Client { return ts.dial(t) }
}

func call(t *testing.T, c *proxy.Client, op string, args map[string]any) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := c.Call(ctx, op, args, nil)
	if err != nil {
		t.Fatalf("%s %v: %v", op, args, err)
	}
	return res
}

func callErr(c *proxy.Client, op string, args map[string]any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Call(ctx, op, args, nil)
	return err
}

func code(err error) wire.Code {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code
	}
	return ""
}

func TestParityConditionNotifyAcrossClients(t *testing.T) {
	dial := parityServer(t)
	a, b := dial(), dial()
	call(t, a, "create", map[string]any{"kind": "lock", "name": "cl"})
	call(t, a, "create", map[string]any{"kind": "condition", "name": "cv", "lock": "cl"})
	cv := map[string]any{"kind": "condition", "name": "cv", "tid": 1}
	if err := callErr(a, "wait", cv); code(err) != wire.CodeNotOwner {
		t.Fatalf("wait without the lock: got %v, want not_owner", err)
	}
	call(t, a, "acquire", cv)
	got := make(chan any, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err := a.Call(ctx, "wait", map[string]any{"kind": "condition", "name": "cv", "tid": 1, "timeout": 4}, nil)
		if err != nil {
			got <- err
			return
		}
		got <- res
	}()
	// b can take the lock only once a's wait released it.
	call(t, b, "acquire", map[string]any{"kind": "condition", "name": "cv", "tid": 2, "timeout": 3})
	call(t, b, "notify", map[string]any{"kind": "condition", "name": "cv", "tid": 2})
	call(t, b, "release", map[string]any{"kind": "condition", "name": "cv", "tid": 2})
	select {
	case r := <-got:
		if r != true {
			t.Fatalf("wait returned %v, want true", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter was not woken")
	}
	call(t, a, "release", cv) // wait reacquired the lock for a
}

func TestParityConditionDeadWaiterPassesNotifyOn(t *testing.T) {
	dial := parityServer(t)
	owner, dying, live := dial(), dial(), dial()
	call(t, owner, "create", map[string]any{"kind": "condition", "name": "cv2"})
	args := func(tid int) map[string]any {
		return map[string]any{"kind": "condition", "name": "cv2", "tid": tid, "timeout": 5}
	}
	results := make(chan any, 2)
	for i, c := range []*proxy.Client{dying, live} {
		call(t, c, "acquire", args(10+i))
		go func(c *proxy.Client, tid int) {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			res, err := c.Call(ctx, "wait", args(tid), nil)
			if err != nil {
				results <- err
				return
			}
			results <- res
		}(c, 10+i)
		deadline := time.Now().Add(3 * time.Second)
		for {
			st, _ := owner.Status(context.Background())
			if waiting(st, "cv2") == i+1 || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	dying.Close() // its waiter is cancelled; the one notify must reach live
	time.Sleep(50 * time.Millisecond)
	call(t, owner, "acquire", args(1))
	call(t, owner, "notify", args(1))
	call(t, owner, "release", args(1))
	timeout := time.After(6 * time.Second)
	for {
		select {
		case r := <-results:
			if r == true {
				return
			}
		case <-timeout:
			t.Fatal("the live waiter never got the notify")
		}
	}
}

func waiting(st map[string]any, name string) int {
	objs, _ := st["objects"].([]any)
	for _, o := range objs {
		m, _ := o.(map[string]any)
		if m["name"] == name {
			switch n := m["waiters"].(type) {
			case int64:
				return int(n)
			case uint64:
				return int(n)
			}
		}
	}
	return -1
}

func TestParityBarrier(t *testing.T) {
	dial := parityServer(t)
	cs := []*proxy.Client{dial(), dial(), dial()}
	call(t, cs[0], "create", map[string]any{"kind": "barrier", "name": "b", "parties": 3})
	var wg sync.WaitGroup
	idx := make(chan int64, 3)
	for _, c := range cs {
		wg.Add(1)
		go func(c *proxy.Client) {
			defer wg.Done()
			res := call(t, c, "wait", map[string]any{"kind": "barrier", "name": "b", "timeout": 5})
			m := res.(map[string]any)
			n, _ := m["index"].(int64)
			idx <- n
		}(c)
	}
	wg.Wait()
	close(idx)
	seen := map[int64]bool{}
	for n := range idx {
		seen[n] = true
	}
	if len(seen) != 3 || !seen[0] || !seen[1] || !seen[2] {
		t.Fatalf("indexes %v, want 0, 1, 2", seen)
	}
	// A timeout breaks the barrier for everyone.
	if err := callErr(cs[0], "wait", map[string]any{"kind": "barrier", "name": "b", "timeout": 0.05}); code(err) != wire.CodeBroken {
		t.Fatalf("timed-out wait: %v, want broken", err)
	}
	if call(t, cs[1], "broken", map[string]any{"kind": "barrier", "name": "b"}) != true {
		t.Fatal("barrier not broken after a timeout")
	}
	call(t, cs[1], "reset", map[string]any{"kind": "barrier", "name": "b"})
	if call(t, cs[1], "broken", map[string]any{"kind": "barrier", "name": "b"}) != false {
		t.Fatal("barrier still broken after reset")
	}
}

func TestParityJoinableQueue(t *testing.T) {
	dial := parityServer(t)
	c := dial()
	q := map[string]any{"kind": "joinable_queue", "name": "jq"}
	call(t, c, "create", q)
	call(t, c, "put", map[string]any{"kind": "joinable_queue", "name": "jq", "item": []byte("x")})
	if r := call(t, c, "join", map[string]any{"kind": "joinable_queue", "name": "jq", "timeout": 0.05}); r != false {
		t.Fatalf("join with an unfinished task: %v", r)
	}
	call(t, c, "get", q)
	call(t, c, "task_done", q)
	if err := callErr(c, "task_done", q); code(err) != wire.CodeValueError {
		t.Fatalf("extra task_done: %v", err)
	}
	if r := call(t, c, "join", map[string]any{"kind": "joinable_queue", "name": "jq", "timeout": 1}); r != true {
		t.Fatalf("join: %v", r)
	}
}

func TestParityDictAndList(t *testing.T) {
	dial := parityServer(t)
	c := dial()
	d := func(kv ...any) map[string]any {
		m := map[string]any{"kind": "dict", "name": "d"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	call(t, c, "create", d())
	call(t, c, "set", d("key", []byte("k1"), "kp", []byte("K1"), "value", []byte("v1")))
	items, _ := msgpack.Marshal([][][]byte{{[]byte("k2"), []byte("K2"), []byte("v2")}, {[]byte("k1"), []byte("K1"), []byte("v1b")}})
	call(t, c, "update", d("items", items))
	if r := call(t, c, "len", d()); fmt.Sprint(r) != "2" {
		t.Fatalf("len %v", r)
	}
	if r := call(t, c, "get", d("key", []byte("k1"))); string(r.([]byte)) != "v1b" {
		t.Fatalf("get %q", r)
	}
	if err := callErr(c, "get", d("key", []byte("nope"))); code(err) != wire.CodeKeyError {
		t.Fatalf("missing key: %v", err)
	}
	all := call(t, c, "items", d()).([]any)
	if len(all) != 2 || string(all[0].([]any)[0].([]byte)) != "K1" {
		t.Fatalf("items not in insertion order: %v", all)
	}

	l := func(kv ...any) map[string]any {
		m := map[string]any{"kind": "list", "name": "l"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	call(t, c, "create", l())
	ext, _ := msgpack.Marshal([][]byte{[]byte("a"), []byte("b"), []byte("c")})
	call(t, c, "extend", l("items", ext))
	call(t, c, "insert", l("index", 0, "value", []byte("z")))
	if r := call(t, c, "getitem", l("index", -1)); string(r.([]byte)) != "c" {
		t.Fatalf("getitem -1: %q", r)
	}
	if err := callErr(c, "getitem", l("index", 9)); code(err) != wire.CodeIndexError {
		t.Fatalf("index out of range: %v", err)
	}
	snap := call(t, c, "snapshot", l()).(map[string]any)
	ver, _ := snap["version"].(int64)
	if uv, ok := snap["version"].(uint64); ok {
		ver = int64(uv)
	}
	call(t, c, "append", l("value", []byte("d"))) // moves the version on
	rep, _ := msgpack.Marshal([][]byte{[]byte("only")})
	if r := call(t, c, "replace", l("items", rep, "version", ver)); r != false {
		t.Fatal("replace with a stale version succeeded")
	}
	if r := call(t, c, "len", l()); fmt.Sprint(r) != "5" {
		t.Fatalf("len %v", r)
	}
}
