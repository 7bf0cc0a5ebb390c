package server_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
)

// TestPlaintextClientOnTLSPortIsTold (issue 12, item 5): a client that
// reaches a TLS port without TLS gets an error saying the port needs TLS,
// within a couple of seconds, instead of "closed the connection" after its
// timeout; TLS clients are unaffected, even slow ones.
func TestPlaintextClientOnTLSPortIsTold(t *testing.T) {
	cert, pool := selfSigned(t)
	key := []byte("tls-sniff-test-key")
	ln := serveTLS(t, key, cert)
	addr := "tcp://" + ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := proxy.Dial(ctx, addr, key)
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
