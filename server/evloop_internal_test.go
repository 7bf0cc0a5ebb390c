package server

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/wire"
)

// A connection served by its own goroutine while the daemon has few moves
// into a loop between two requests once the daemon has EventLoopMinConns:
// a request it had parked before is answered after, its pipelined requests
// keep their order across the move, and it is served by the loop from then
// on.
func TestConnectionMovesIntoALoop(t *testing.T) {
	key := []byte("k")
	srv, err := New(Config{Key: key, Logger: zerolog.Nop(), EventLoopMinConns: 3}, manager.New(manager.DefaultConfig()))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/tmp", "sml")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "s")
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	dial := func() net.Conn {
		nc, err := net.DialTimeout("unix", path, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := auth.Client(nc, auth.ClientConfig{Key: key, Label: "t"}); err != nil {
			t.Fatal(err)
		}
		return nc
	}
	send := func(_ net.Conn, id uint64, op string, args map[string]any) []byte {
		f, err := wire.EncodeRequest(id, op, args)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	recv := func(nc net.Conn) wire.Reply {
		body, err := wire.ReadFrame(nc, wire.DefaultMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := wire.DecodeReply(body)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	// inLoops waits until the server tracks want connections, and until
	// (for a while) settled says the number of them in a loop is final;
	// it returns that number. A connection moves after its reply is
	// written, so a client can see the reply first.
	inLoops := func(want int, settled func(int) bool) (n int) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			srv.mu.Lock()
			n = 0
			for c := range srv.conns {
				if c.lp.Load() != nil {
					n++
				}
			}
			have := len(srv.conns)
			srv.mu.Unlock()
			if have == want && settled(n) || time.Now().After(deadline) {
				return n
			}
			time.Sleep(time.Millisecond)
		}
	}
	anyN := func(int) bool { return true }
	is := func(k int) func(int) bool { return func(n int) bool { return n == k } }

	first := dial()
	defer first.Close()
	obj := map[string]any{"kind": "queue", "name": "q"}
	if _, err := first.Write(send(first, 1, "create", obj)); err != nil {
		t.Fatal(err)
	}
	if rep := recv(first); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	if _, err := first.Write(send(first, 2, "get", map[string]any{"kind": "queue", "name": "q", "timeout": 5.0})); err != nil {
		t.Fatal(err) // parked: answered after the move
	}
	if n := inLoops(1, anyN); n != 0 {
		t.Fatalf("%d connections in a loop with one connection open", n)
	}
	others := []net.Conn{dial(), dial()}
	for _, o := range others {
		defer o.Close()
	}
	// The third went straight to a loop; the first moves after its next
	// request (which may already be the parked get, read before).
	if n := inLoops(3, anyN); n < 1 || n > 2 {
		t.Fatalf("%d connections in a loop once three are open, want the third (and maybe the first)", n)
	}
	var batch bytes.Buffer
	for i := range 40 { // the move happens after the first of these
		batch.Write(send(first, uint64(10+i), "create", map[string]any{"kind": "dict", "name": fmt.Sprint("d", i)}))
	}
	if _, err := first.Write(batch.Bytes()); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if rep := recv(first); rep.Err != nil || rep.ID != uint64(10+i) {
			t.Fatalf("reply %d: %+v, want id %d", i, rep, 10+i)
		}
	}
	if n := inLoops(3, is(2)); n != 2 {
		t.Fatalf("%d connections in a loop after the first one's requests, want 2 (the second has sent nothing)", n)
	}
	if _, err := others[0].Write(send(others[0], 1, "put", map[string]any{"kind": "queue", "name": "q", "item": []byte("x")})); err != nil {
		t.Fatal(err)
	}
	if rep := recv(others[0]); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	if rep := recv(first); rep.ID != 2 || rep.Err != nil {
		t.Fatalf("the get parked before the move: %+v", rep)
	}
	if n := inLoops(3, is(3)); n != 3 {
		t.Fatalf("%d connections in a loop after the second one's request, want 3", n)
	}
}
