package proxy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
)

// TestWithTLSPin: a server with a self-signed certificate is reached with
// its fingerprint pinned (in lower case, upper case, or with colons), and
// refused in the TLS handshake with any other pin, or a malformed one.
func TestWithTLSPin(t *testing.T) {
	cfg, fp, err := server.SelfSignedTLS("127.0.0.1", time.Now())
	must(t, err)
	if len(fp) != 64 || strings.ToLower(fp) != fp {
		t.Fatalf("fingerprint %q: want 64 lowercase hex digits", fp)
	}
	srv, err := server.New(server.Config{Key: clientKey, Logger: zerolog.Nop()}, manager.New(manager.DefaultConfig()))
	must(t, err)
	ln, err := server.ListenTCP("127.0.0.1:0", cfg)
	must(t, err)
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		srv.Shutdown(ctx)
	})
	addr := "tcp://" + ln.Addr().String()

	colons := ""
	for i := 0; i < len(fp); i += 2 {
		colons += strings.ToUpper(fp[i:i+2]) + ":"
	}
	for _, pin := range []string{fp, strings.ToUpper(fp), strings.TrimSuffix(colons, ":")} {
		c := dialC(t, addr, proxy.WithTLSPin(pin))
		must(t, c.Ping(bctx(t)))
	}

	wrong := strings.Repeat("0", 64)
	for _, pin := range []string{wrong, "not hex", fp[:62]} {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		c, err := proxy.Dial(ctx, addr, clientKey, proxy.WithTLSPin(pin))
		cancel()
		if err == nil {
			c.Close()
			t.Fatalf("pin %q: connected", pin)
		}
		if !strings.Contains(err.Error(), "tls handshake") {
			t.Fatalf("pin %q: %v, want a TLS handshake error", pin, err)
		}
		if pin == wrong && !errors.Is(err, proxy.ErrTLSPin) {
			t.Fatalf("pin %q: %v, want ErrTLSPin", pin, err)
		}
	}
}
