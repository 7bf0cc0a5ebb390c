package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
)

// selfSigned makes a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "syncmgr test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}, pool
}

// serveTLS runs a daemon with key on a TLS listener on 127.0.0.1 until the test ends.
func serveTLS(t *testing.T, key []byte, cert tls.Certificate) net.Listener {
	t.Helper()
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
	return ln
}

func TestTLSListener(t *testing.T) {
	cert, pool := selfSigned(t)
	key := []byte("tls-test-key")
	ln := serveTLS(t, key, cert)
	addr := "tcp://" + ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	c, err := proxy.Dial(ctx, addr, key, proxy.WithTLS(&tls.Config{RootCAs: pool}))
	if err != nil {
		t.Fatalf("dial over tls: %v", err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "tls-lock")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}

	// A client that does not trust the certificate fails the TLS handshake.
	if _, err := proxy.Dial(ctx, addr, key, proxy.WithTLS(&tls.Config{})); err == nil {
		t.Fatal("dial with an untrusted certificate succeeded")
	}
	// A plain-TCP client cannot talk to the TLS listener.
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	defer pcancel()
	if _, err := proxy.Dial(pctx, addr, key); err == nil {
		t.Fatal("plain dial to a TLS listener succeeded")
	}
}

// TestDialEnvReadsTLSFromTheEnvironment: a Go worker configured only by the
// variables Manager.runtime_env() hands out reaches a TLS daemon.
func TestDialEnvReadsTLSFromTheEnvironment(t *testing.T) {
	cert, _ := selfSigned(t)
	key := []byte("tls-env-test-key-0123456789")
	ln := serveTLS(t, key, cert)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(proxy.EnvAddress, "tcp://"+ln.Addr().String())
	t.Setenv("SYNCMGR_AUTHKEY", hex.EncodeToString(key))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	t.Setenv(proxy.EnvTLSCA, "")
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	defer pcancel()
	if c, err := proxy.DialEnv(pctx); err == nil {
		c.Close()
		t.Fatal("DialEnv without TLS settings reached the TLS port")
	}
	t.Setenv(proxy.EnvTLSCA, ca)
	c, err := proxy.DialEnv(ctx)
	if err != nil {
		t.Fatalf("DialEnv with %s: %v", proxy.EnvTLSCA, err)
	}
	defer c.Close()
	ev, err := c.Event(ctx, "tls-env")
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.Set(ctx); err != nil {
		t.Fatal(err)
	}
	t.Setenv(proxy.EnvTLSCA, filepath.Join(t.TempDir(), "missing.pem"))
	if _, err := proxy.DialEnv(ctx); err == nil {
		t.Fatal("DialEnv with a missing CA file succeeded")
	}
}
