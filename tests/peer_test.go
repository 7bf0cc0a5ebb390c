package tests

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

// TestMain's binary doubles as a second client process: with
// SYNCMGR_TEST_PEER set it connects to that socket, creates the object
// named by SYNCMGR_TEST_OBJECT and prints "ok" or the error.
func init() {
	sock := os.Getenv("SYNCMGR_TEST_PEER")
	if sock == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	key, err := hex.DecodeString(os.Getenv("SYNCMGR_TEST_KEY"))
	var c *proxy.Client
	if err == nil {
		c, err = proxy.Dial(ctx, sock, key)
	}
	if err == nil {
		_, err = c.Call(ctx, wire.OpCreate, obj(wire.KindEvent, os.Getenv("SYNCMGR_TEST_OBJECT")), nil)
		c.Close()
	}
	if err != nil {
		fmt.Println(err)
	} else {
		fmt.Println("ok")
	}
	os.Exit(0)
}

// otherProcess creates an object from another process (another peer).
func otherProcess(t *testing.T, d *daemon, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SYNCMGR_TEST_PEER="+d.sock, "SYNCMGR_TEST_KEY="+d.key, "SYNCMGR_TEST_OBJECT="+name)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("other process: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestObjectCapCountsByPeer: the objects-per-client cap counts a process's
// live objects over all its sessions, so reconnecting does not reset it;
// another process has its own count.
func TestObjectCapCountsByPeer(t *testing.T) {
	d := startDaemon(t, "--max-objects-per-client", "3")
	for i := 0; i < 3; i++ {
		c := d.dial(t) // a new session each time
		call(t, c, wire.OpCreate, obj(wire.KindEvent, fmt.Sprintf("e%d", i)))
		c.Close()
	}
	c := d.dial(t)
	if err := callErr(c, wire.OpCreate, obj(wire.KindEvent, "e3")); code(err) != wire.CodeLimit {
		t.Fatalf("fourth object after reconnecting: %v, want limit", err)
	}
	if _, err := c.Delete(t.Context(), "e3"); err != nil {
		t.Fatal(err)
	}
	if got := otherProcess(t, d, "other"); got != "ok" {
		t.Fatalf("another process: %s", got)
	}
	if ok, err := c.Delete(t.Context(), "e0"); err != nil || !ok {
		t.Fatalf("delete e0: %v %v", ok, err)
	}
	call(t, c, wire.OpCreate, obj(wire.KindEvent, "e3")) // room again
}

// openPinged dials and pings: a connection that answers a ping has been
// counted by the daemon (a refusal may come before the handshake or, when
// two raced, as the first frame after it).
func openPinged(ctx context.Context, d *daemon) (*proxy.Client, error) {
	c, err := proxy.Dial(ctx, d.sock, d.keyBytes())
	if err != nil {
		return nil, err
	}
	if err := c.Ping(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// openEventually retries openPinged until it succeeds (a connection closed
// just before is released by the daemon a moment later).
func openEventually(t *testing.T, ctx context.Context, d *daemon) *proxy.Client {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		c, err := openPinged(ctx, d)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConnCapCountsByPeer: one process cannot take every connection: past
// --max-conns-per-client its connections are refused with limit, while
// another process still connects.
func TestConnCapCountsByPeer(t *testing.T) {
	d := startDaemon(t, "--max-conns-per-client", "4", "--max-conns", "100")
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var cs []*proxy.Client
	for i := 0; i < 4; i++ {
		cs = append(cs, openEventually(t, ctx, d))
	}
	short, cancelShort := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancelShort()
	if _, err := openPinged(short, d); code(err) != wire.CodeLimit {
		t.Fatalf("fifth connection: %v, want limit (after retrying until its deadline)", err)
	}
	if got := otherProcess(t, d, "x"); got != "ok" {
		t.Fatalf("another process: %s", got)
	}
	// Issue 22, finding 3: Dial retries a limit answer within its deadline,
	// so a fifth connection asked for now gets in once one of the four goes.
	type result struct {
		c   *proxy.Client
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := openPinged(ctx, d)
		got <- result{c, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("a fifth connection got an answer while four were open: %v", r.err)
	case <-time.After(500 * time.Millisecond): // it is retrying
	}
	cs[0].Close()
	r := <-got
	if r.err != nil {
		t.Fatalf("the retried connection: %v", r.err)
	}
	r.c.Close()
}

// TestConnCapCountsTCPBySourceAddress: over TCP a peer is its source
// address: 127.0.0.1 at its cap does not stop 127.0.0.2, and only
// authenticated connections count.
func TestConnCapCountsTCPBySourceAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d := startDaemon(t, "--tcp", addr, "--max-conns-per-client", "2")
	// dial authenticates from src and pings: the error is the refusal,
	// before the handshake or as the first frame after it.
	dial := func(src string) error {
		dl := net.Dialer{Timeout: bound, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		nc, err := dl.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", src, err)
		}
		t.Cleanup(func() { nc.Close() })
		_ = nc.SetDeadline(time.Now().Add(bound))
		if _, err := auth.Client(nc, auth.ClientConfig{Key: d.keyBytes()}); err != nil {
			return err
		}
		r := &rawConn{t: t, nc: nc}
		r.send(1, wire.OpPing, map[string]any{})
		if rep := r.recv(); rep.Err != nil {
			return rep.Err
		}
		return nil
	}
	// Connections that never authenticate use none of the address's share.
	for i := 0; i < 3; i++ {
		nc, err := net.DialTimeout("tcp", addr, bound)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
	}
	for i := 0; i < 2; i++ {
		if err := dial("127.0.0.1"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	if err := dial("127.0.0.1"); code(err) != wire.CodeLimit {
		t.Fatalf("third from 127.0.0.1: %v, want limit", err)
	}
	if err := dial("127.0.0.2"); err != nil {
		t.Fatalf("from 127.0.0.2: %v", err)
	}
}
