package server_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
)

// TestPlaintextClientOnTLSPortIsTold (issue 12, item 5): a client that
// reaches a TLS port without TLS gets an error saying the port needs TLS,
// within a couple of seconds, instead of "closed the connection" after its
// timeout; TLS clients are unaffected, even slow ones.
func TestPlaintextClientOnTLSPortIsTold(t *testing.T) {
	cert, pool := selfSigned(t)
	key := []byte("tls-sniff-test-key")
	srv, err := server.New(server.Config{Key: key, Logger: zerolog.Nop()}, manager.New(manager.DefaultConfig()))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := server.ListenTCP("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	addr := "tcp://" + ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = proxy.Dial(ctx, addr, key)
	if err == nil || !strings.Contains(err.Error(), "requires TLS") {
		t.Fatalf("plain dial to a TLS port: %v, want an error saying it requires TLS", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("the plaintext client waited %v", el)
	}
	c, err := proxy.Dial(ctx, addr, key, proxy.WithTLS(&tls.Config{RootCAs: pool}))
	if err != nil {
		t.Fatalf("dial over tls after the sniffing: %v", err)
	}
	defer c.Close()
	if _, err := c.Call(ctx, "ping", nil, nil); err != nil {
		t.Fatal(err)
	}
}
