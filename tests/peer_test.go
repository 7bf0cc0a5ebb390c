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

// TestConnCapCountsByPeer: one process cannot take every connection: past
// --max-conns-per-client its handshakes are refused with limit, while
// another process still connects.
func TestConnCapCountsByPeer(t *testing.T) {
	d := startDaemon(t, "--max-conns-per-client", "4", "--max-conns", "100")
	var cs []*proxy.Client
	for i := 0; i < 4; i++ {
		cs = append(cs, d.dial(t))
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if _, err := proxy.Dial(ctx, d.sock, d.keyBytes()); code(err) != wire.CodeLimit {
		t.Fatalf("fifth connection: %v, want limit", err)
	}
	if got := otherProcess(t, d, "x"); got != "ok" {
		t.Fatalf("another process: %s", got)
	}
	cs[0].Close()
	deadline := time.Now().Add(bound)
	for {
		c, err := proxy.Dial(ctx, d.sock, d.keyBytes())
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection after one closed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
	dial := func(src string) error {
		dl := net.Dialer{Timeout: bound, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		nc, err := dl.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", src, err)
		}
		t.Cleanup(func() { nc.Close() })
		_ = nc.SetDeadline(time.Now().Add(bound))
		_, err = auth.Client(nc, auth.ClientConfig{Key: d.keyBytes()})
		return err
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
