package server_test

import (
	"bytes"
	"time"

	"testing"

	"github.com/syncmgr/syncmgr/wire"
)

// TestOversizedFrameSkipped: after authentication, a frame over --max-frame
// is answered too_large under its request id and its body is skipped; the
// connection and everything its session holds live on (issue 11, bug 1).
// The same over TLS, where the body comes through crypto/tls.
func TestOversizedFrameSkipped(t *testing.T) {
	limit := func(o *serverOpts) { o.cfg.MaxFrame = 64 << 10 }
	t.Run("unix", func(t *testing.T) { testOversizedFrameSkipped(t, startServer(t, limit)) })
	t.Run("tls", func(t *testing.T) { testOversizedFrameSkipped(t, startServer(t, limit, overTLS)) })
}

func testOversizedFrameSkipped(t *testing.T, ts *testServer) {
	other := ts.dial(t)
	r := ts.raw(t, nil)
	r.send(1, "create", obj("lock", "L"))
	if rep := r.recv(); rep.ID != 1 || rep.Err != nil {
		t.Fatalf("create: %+v", rep)
	}
	r.send(2, "acquire", obj("lock", "L", "tid", 1))
	if rep := r.recv(); rep.ID != 2 || rep.Result != true {
		t.Fatalf("acquire: %+v", rep)
	}
	r.send(3, "create", obj("dict", "D"))
	if rep := r.recv(); rep.ID != 3 || rep.Err != nil {
		t.Fatalf("create dict: %+v", rep)
	}
	for i, size := range []int{70000, 1 << 20} { // just over the limit, and far over
		id := uint64(10 + i)
		r.send(id, "set", obj("dict", "D", "key", []byte("k"), "kp", []byte("k"), "value", make([]byte, size)))
		rep := r.recv()
		if rep.ID != id || rep.Err == nil || rep.Err.Code != wire.CodeTooLarge {
			t.Fatalf("oversized set: %+v, want too_large for id %d", rep, id)
		}
		// The stream is still in step: the next request is answered.
		r.send(id+100, "len", obj("dict", "D"))
		if rep := r.recv(); rep.ID != id+100 || rep.Result != int64(0) {
			t.Fatalf("len after the oversized frame: %+v (the set must have had no effect)", rep)
		}
	}
	// The lock is still held by the raw connection's session.
	if got := call(t, other, "acquire", obj("lock", "L", "tid", 2, "block", false)); got != false {
		t.Fatalf("another client acquired L: the oversized frame dropped the session's lock")
	}
	r.send(20, "release", obj("lock", "L", "tid", 1))
	if rep := r.recv(); rep.ID != 20 || rep.Err != nil {
		t.Fatalf("release: %+v", rep)
	}
}

// TestEmptyContainersAreArrays: an empty list's snapshot, and an empty
// dict's items, are empty arrays on the wire, never nil (a nil broke the
// Python client's m.list()).
func TestEmptyContainersAreArrays(t *testing.T) {
	ts := startServer(t)
	c := ts.dial(t)
	call(t, c, "create", obj("list", "Le"))
	snap, ok := call(t, c, "snapshot", obj("list", "Le")).(map[string]any)
	if !ok {
		t.Fatal("snapshot is not a map")
	}
	if items, ok := snap["items"].([]any); !ok || len(items) != 0 {
		t.Fatalf("empty list snapshot items: %#v, want an empty array", snap["items"])
	}
	call(t, c, "create", obj("dict", "De"))
	if items, ok := call(t, c, "items", obj("dict", "De")).([]any); !ok || len(items) != 0 {
		t.Fatalf("empty dict items: %#v, want an empty array", items)
	}
	// After emptying a list that had items.
	call(t, c, "append", obj("list", "Le", "value", []byte("x")))
	call(t, c, "pop", obj("list", "Le"))
	snap = call(t, c, "snapshot", obj("list", "Le")).(map[string]any)
	if items, ok := snap["items"].([]any); !ok || len(items) != 0 {
		t.Fatalf("emptied list snapshot items: %#v", snap["items"])
	}
}

// TestGetUndoneWhenReplyCannotBeWritten: an item got on the immediate
// (non-parked) path whose reply cannot be written before the write deadline
// goes back to the front of the queue (issue 11, bug 3).
func TestGetUndoneWhenReplyCannotBeWritten(t *testing.T) {
	// The deadline also bounds the 16 MiB reply to the reading client, which
	// the race detector can slow past 200 ms: 1 s keeps it clear of that.
	ts := startServer(t, func(o *serverOpts) { o.cfg.WriteTimeout = time.Second })
	other := ts.dial(t)
	call(t, other, "create", obj("queue", "Q"))
	big := bytes.Repeat([]byte("item"), 4<<20) // 16 MiB: far more than the socket buffers
	call(t, other, "put", obj("queue", "Q", "item", big))
	call(t, other, "put", obj("queue", "Q", "item", []byte("second")))

	r := ts.raw(t, nil)
	r.send(1, "get", obj("queue", "Q", "block", false)) // and never read the reply
	deadline := time.Now().Add(5 * time.Second)
	for call(t, other, "qsize", obj("queue", "Q")) != int64(1) { // the get has happened
		if time.Now().After(deadline) {
			t.Fatal("the raw client's get did not happen")
		}
		time.Sleep(time.Millisecond)
	}
	ts.waitSessions(t, 1) // the write deadline ends the raw connection and its session

	got := call(t, other, "get", obj("queue", "Q", "timeout", 5))
	if b, _ := got.([]byte); !bytes.Equal(b, big) {
		t.Fatalf("first item after the failed delivery: %d bytes, want the %d-byte item back at the front", len(b), len(big))
	}
	if got := call(t, other, "get", obj("queue", "Q", "timeout", 5)); !bytes.Equal(got.([]byte), []byte("second")) {
		t.Fatalf("second item: %q", got)
	}
}
