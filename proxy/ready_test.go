package proxy_test

import (
	"context"
	"crypto/hmac"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

// oldDaemon answers handshakes as a daemon older than the ready frame: its
// hello does not say it reads one, and it takes the client's first frame
// for its auth. It counts connections and the ready frames it was sent.
func oldDaemon(t *testing.T, key []byte) (path string, conns, readies *atomic.Int64) {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "smo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path = filepath.Join(dir, "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns, readies = new(atomic.Int64), new(atomic.Int64)
	send := func(c net.Conn, v any) {
		b, err := wire.Marshal(v)
		if err == nil {
			_ = wire.WriteFrame(c, b)
		}
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				ns, _ := auth.Nonce()
				send(c, auth.Hello{T: "hello", Versions: []int{auth.Version}, Nonce: ns, MaxFrame: 1 << 20, Server: "old"})
				body, err := wire.ReadFrame(c, wire.HandshakeMaxFrame)
				if err != nil {
					return
				}
				var a auth.Auth
				if err := wire.Unmarshal(body, &a); err != nil || a.T != "auth" {
					if a.T == "ready" {
						readies.Add(1)
					}
					send(c, auth.ErrorMsg{T: "error", Code: string(wire.CodeBadRequest), Message: "expected an auth message"})
					return
				}
				if !hmac.Equal(a.MAC, auth.MAC(key, auth.ClientLabel, ns, a.Nonce)) {
					send(c, auth.ErrorMsg{T: "error", Code: string(wire.CodeAuthFailed), Message: "wrong key"})
					return
				}
				send(c, auth.Welcome{T: "welcome", MAC: auth.MAC(key, auth.ServerLabel, a.Nonce, ns), Session: a.Session, Conn: 1})
				_, _ = wire.ReadFrame(c, 1<<20) // until the client goes
			}()
		}
	}()
	return path, conns, readies
}

// TestDialFallsBackForDaemonsWithoutReady: a client connects to a daemon
// older than the ready frame: the first time with one extra connection
// (its hello does not say it reads ready: the client drops that
// connection), then, the address remembered, with one connection and no
// ready frame.
func TestDialFallsBackForDaemonsWithoutReady(t *testing.T) {
	key := []byte("old-daemon-test-key")
	path, conns, readies := oldDaemon(t, key)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	for i := range 2 {
		c, err := proxy.Dial(ctx, path, key)
		if err != nil {
			t.Fatalf("dial %d to an old daemon: %v", i, err)
		}
		c.Close()
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections for two dials, want 3 (one extra, the first time only)", n)
	}
	// The old daemon counts the ready frame when it reads it, which may be
	// after the client has moved on from that connection.
	waitFor(t, "the old daemon to read the ready frame", func() bool { return readies.Load() >= 1 })
	if n := readies.Load(); n != 1 {
		t.Fatalf("the old daemon was sent %d ready frames, want 1 (the first connection only; a bad_request, not a wrong key)", n)
	}
}
