package server_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
	"github.com/syncmgr/syncmgr/wire"
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

// firstWriteJoins is a connection whose first write carries extra bytes
// with it, in the same TLS record.
type firstWriteJoins struct {
	net.Conn
	extra []byte
}

func (c *firstWriteJoins) Write(b []byte) (int, error) {
	if c.extra == nil {
		return c.Conn.Write(b)
	}
	joined := append(append([]byte(nil), b...), c.extra...)
	c.extra = nil
	if _, err := c.Conn.Write(joined); err != nil {
		return 0, err
	}
	return len(b), nil
}

// A TLS client's first request sent in the same record as its handshake's
// last frame is answered: the daemon's TLS layer holds it when the
// connection moves into an event loop, where its socket has nothing more
// to say.
func TestRequestInTheHandshakesLastRecordIsAnswered(t *testing.T) {
	ts := startServer(t, overTLS)
	nc, err := tls.DialWithDialer(&net.Dialer{Timeout: bound}, "tcp", ts.path, ts.tls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(bound))
	ping, err := wire.EncodeRequest(7, "ping", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Client(&firstWriteJoins{Conn: nc, extra: ping}, auth.ClientConfig{Key: testKey, Label: "t"}); err != nil {
		t.Fatal(err)
	}
	r := &rawConn{t: t, nc: nc}
	if rep := r.recv(); rep.ID != 7 || rep.Err != nil {
		t.Fatalf("reply to the request sent with the handshake: %+v", rep)
	}
}

// lockedBuffer is a bytes.Buffer a process's output goes to while a test
// reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// pipeRW is a process's stdout and stdin as one stream.
type pipeRW struct {
	io.Reader
	io.Writer
}

// A TLS 1.3 client's KeyUpdate asking the daemon to update its keys too,
// sent by openssl s_client ('K'), between requests and while a request is
// parked: the daemon answers it from inside its read, in its event loop,
// and that answer reaches the client ahead of every reply sealed with the
// new key and behind every one sealed with the old (a reply out of that
// order is a record the client cannot decrypt).
func TestTLSKeyUpdateIsAnsweredInOrder(t *testing.T) {
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("no openssl to send a KeyUpdate")
	}
	ts := startServer(t, overTLS)
	other := ts.dial(t)
	call(t, other, "create", obj("queue", "K"))
	cmd := exec.Command(bin, "s_client", "-connect", ts.path, "-tls1_3", "-quiet", "-no_ign_eof", "-noservername")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(4*bound, func() { _ = cmd.Process.Kill() }) // a read that never ends
	defer func() {
		timer.Stop()
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	rw := &pipeRW{Reader: stdout, Writer: stdin}
	if _, err := auth.Client(rw, auth.ClientConfig{Key: testKey, Label: "openssl"}); err != nil {
		t.Fatalf("handshake through openssl: %v (%s)", err, stderr.String())
	}
	send := func(id uint64, op string, args map[string]any) {
		t.Helper()
		f, err := wire.EncodeRequest(id, op, args)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stdin.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(want uint64) wire.Reply {
		t.Helper()
		body, err := wire.ReadFrame(stdout, wire.DefaultMaxFrame)
		if err != nil {
			t.Fatalf("reply %d: %v (openssl: %s)", want, err, stderr.String())
		}
		rep, err := wire.DecodeReply(body)
		if err != nil || rep.ID != want || rep.Err != nil {
			t.Fatalf("reply %+v (%v), want id %d", rep, err, want)
		}
		return rep
	}
	keyUpdate := func() {
		t.Helper()
		time.Sleep(50 * time.Millisecond) // s_client reads the command as a read of its own
		if _, err := io.WriteString(stdin, "K\n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	send(1, "ping", nil)
	recv(1)
	for round := range 3 {
		id := uint64(10 * (round + 1))
		keyUpdate()
		send(id, "ping", nil) // carries the KeyUpdate (s_client sends it with its next write)
		recv(id)
		send(id+1, "get", obj("queue", "K", "timeout", 10)) // parked
		keyUpdate()
		send(id+2, "ping", nil)
		recv(id + 2)
		call(t, other, "put", obj("queue", "K", "item", []byte(fmt.Sprint(round))))
		if got := recv(id + 1); string(got.Result.([]byte)) != fmt.Sprint(round) {
			t.Fatalf("the parked get got %q, want %q", got.Result, fmt.Sprint(round))
		}
	}
	// A KeyUpdate while a large reply waits in the daemon as plaintext,
	// sealed a piece at a time as the client reads it (the client reads
	// nothing yet): its answer goes out between two pieces, ahead of every
	// record sealed after it, and the ping's reply, sealed later still,
	// comes after the large one.
	big := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB: more than the sockets between take
	call(t, other, "put", obj("queue", "K", "item", big))
	send(100, "get", obj("queue", "K"))
	keyUpdate()
	send(101, "ping", nil)
	if got := recv(100); !bytes.Equal(got.Result.([]byte), big) {
		t.Fatalf("the large reply came back as %d bytes, not the %d put", len(got.Result.([]byte)), len(big))
	}
	recv(101)
	if n := strings.Count(stderr.String(), "KEYUPDATE"); n != 7 {
		t.Fatalf("openssl sent %d KeyUpdates, want 7 (%s)", n, stderr.String())
	}
}
