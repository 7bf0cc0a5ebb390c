package server_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

func asInt(t *testing.T, v any) int64 {
	t.Helper()
	switch x := v.(type) {
	case int64:
		return x
	case uint64:
		return int64(x)
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	}
	t.Fatalf("not an integer: %T %v", v, v)
	return 0
}

// A Unix-socket client attaches, maps the segment, takes a Lock by CAS and
// dies: the daemon releases the word and hands the lock to a socket client
// waiting for it. TCP clients are refused.
func TestFastpathAttachRefAndSessionEnd(t *testing.T) {
	ts, seg := startFastServer(t)

	fast := ts.raw(t, []byte("fast-session"))
	fast.send(1, wire.OpFastpathAttach, map[string]any{})
	rep := fast.recv()
	if rep.Err != nil {
		t.Fatalf("attach: %v", rep.Err)
	}
	info := rep.Result.(map[string]any)
	if _, named := info["path"]; named || asInt(t, info["size"]) != seg.Size() || info["boot_id"] == "" || info["run"] == "" {
		t.Fatalf("attach reply %v", info)
	}
	slot := uint32(asInt(t, info["slot"]))
	// (The descriptor came with the reply; this reader drops it. The Go and
	// Python clients' tests receive it.)
	client, err := statemem.OpenFD(seg.FD(), seg.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	fast.send(2, wire.OpCreate, map[string]any{"kind": "lock", "name": "fl"})
	if rep := fast.recv(); rep.Err != nil {
		t.Fatalf("create: %v", rep.Err)
	}
	fast.send(3, wire.OpFastpathRef, map[string]any{"kind": "lock", "name": "fl"})
	rep = fast.recv()
	if rep.Err != nil {
		t.Fatalf("ref: %v", rep.Err)
	}
	ref := rep.Result.(map[string]any)
	off, tag := uint32(asInt(t, ref["off"])), uint32(asInt(t, ref["tag"]))
	if atomic.LoadUint32(client.Tag(off)) != tag || uint8(tag) != statemem.KindLock {
		t.Fatalf("tag %x at %d, reply %x", atomic.LoadUint32(client.Tag(off)), off, tag)
	}
	// A create that asks for it carries the same word in its reply: one
	// round trip to make a fast-path object.
	fast.send(4, wire.OpCreate, map[string]any{"kind": "lock", "name": "fl", "fastpath": true})
	rep = fast.recv()
	if rep.Err != nil {
		t.Fatalf("create with fastpath: %v", rep.Err)
	}
	fp, _ := rep.Result.(map[string]any)["fp"].([]any)
	if len(fp) != 3 || uint32(asInt(t, fp[0])) != off || uint32(asInt(t, fp[1])) != tag || fp[2] != ref["run"] {
		t.Fatalf("create reply's word %v, fastpath_ref's %v", fp, ref)
	}
	if r := statemem.LockAcquire(client.State(off), client.Aux(off), slot, 5, 0); r != statemem.OK {
		t.Fatalf("fast acquire: %v", r)
	}

	// A socket client waits; the fast holder's session ends.
	c := ts.dial(t)
	mu, err := c.Lock(ctxT(t), "fl")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		ok, err := mu.AcquireTimeout(context.Background(), 10*time.Second)
		if err == nil && !ok {
			err = context.DeadlineExceeded
		}
		got <- err
	}()
	ts.waitWaiters(t, "lock", "fl", 1)
	if r := statemem.LockRelease(client.State(off), client.Aux(off)); r != statemem.Daemon {
		t.Fatalf("fast release with a socket waiter: %v", r)
	}
	start := time.Now()
	fast.nc.Close()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("socket waiter: %v", err)
		}
		t.Logf("waiter got the dead fast holder's lock after %v", time.Since(start))
	case <-time.After(bound):
		t.Fatal("the dead session's fast-path lock was not released")
	}

	// Refusals: an object without a word, an unknown object, a TCP client.
	other := ts.raw(t, nil)
	other.send(1, wire.OpCreate, map[string]any{"kind": "queue", "name": "fs"})
	other.recv()
	for _, args := range []map[string]any{{"kind": "queue", "name": "fs"}, {"kind": "lock", "name": "nope"}} {
		other.send(2, wire.OpFastpathRef, args)
		if rep := other.recv(); rep.Err == nil {
			t.Fatalf("ref %v accepted", args)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ts.srv.Serve(ln)
	nc, err := net.DialTimeout("tcp", ln.Addr().String(), bound)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(bound))
	if _, err := auth.Client(nc, auth.ClientConfig{Key: testKey, Label: "tcp"}); err != nil {
		t.Fatal(err)
	}
	tcp := &rawConn{t: t, nc: nc}
	tcp.send(1, wire.OpFastpathAttach, map[string]any{})
	if rep := tcp.recv(); rep.Err == nil || rep.Err.Code != wire.CodeUnknownOp {
		t.Fatalf("TCP attach: %+v", rep)
	}
	tcp.send(2, wire.OpCreate, map[string]any{"kind": "lock", "name": "tl", "fastpath": true})
	if rep := tcp.recv(); rep.Err != nil || rep.Result.(map[string]any)["fp"] != nil {
		t.Fatalf("a TCP client's create carried a word: %+v", rep)
	}
}
