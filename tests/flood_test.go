package tests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

// freeTCPPort returns a loopback port that was free a moment ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// flood keeps n idle TCP connections open to addr from the local address
// from until stop is closed, reopening the ones the daemon drops at up to
// 1,000 new connections a second (the reported attack opened about 30 a
// second). It returns how many connections it opened.
func flood(addr, from string, n int, stop <-chan struct{}) func() int64 {
	var opened atomic.Int64
	var wg sync.WaitGroup
	const workers = 50
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Replace connections the daemon has closed.
				live := held[:0]
				for _, c := range held {
					_ = c.SetReadDeadline(time.Now().Add(time.Microsecond))
					if _, err := c.Read(make([]byte, 512)); err != nil && !isTimeout(err) {
						c.Close()
						continue
					}
					live = append(live, c)
				}
				held = live
				for k := 0; k < 2 && len(held) < n/workers+boolInt(w < n%workers); k++ { // <= 2 per 100 ms per worker
					c, err := d.Dial("tcp", addr)
					if err != nil {
						break
					}
					opened.Add(1)
					held = append(held, c)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	return func() int64 { wg.Wait(); return opened.Load() }
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// legit connects (handshake and a ping) rounds times to address, each within
// 1 s, and returns how many succeeded.
func legit(address string, key []byte, rounds int) (ok int, errs []string) {
	for range rounds {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := proxy.Dial(ctx, address, key)
		if err == nil {
			_, err = c.Call(ctx, "ping", nil, nil)
			c.Close()
		}
		cancel()
		if err == nil {
			ok++
		} else if len(errs) < 5 {
			errs = append(errs, err.Error())
		}
	}
	return ok, errs
}

// TestHandshakeFlood (issue 12, item 3): 1,000 idle TCP connections that
// never finish their handshake (reopened as fast as the daemon drops them)
// do not keep legitimate Unix or TCP clients out: each connects (handshake
// and ping) within 1 s at least 99% of the time. The attack comes from
// 127.0.0.2, the TCP clients from 127.0.0.1; and then from the clients' own
// address 127.0.0.1, with the same 99% (issue 22, finding 5: clients speak
// first, and silent connections are dropped before them).
func TestHandshakeFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("flood test: skipped in -short")
	}
	for _, tc := range []struct {
		name, from string
		min        float64
	}{{"other-source", "127.0.0.2", 0.99}, {"same-source", "127.0.0.1", 0.99}} {
		t.Run(tc.name, func(t *testing.T) {
			port := freeTCPPort(t)
			tcpAddr := fmt.Sprintf("127.0.0.1:%d", port)
			d := startDaemon(t, "--tcp", tcpAddr, "--log-level", "info")
			stop := make(chan struct{})
			wait := flood(tcpAddr, tc.from, 1000, stop)
			time.Sleep(1500 * time.Millisecond) // let the flood reach 1,000 connections
			const rounds = 200
			var uok, tok int
			var uerr, terr []string
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); uok, uerr = legit(d.sock, d.keyBytes(), rounds) }()
			go func() { defer wg.Done(); tok, terr = legit("tcp://"+tcpAddr, d.keyBytes(), rounds) }()
			wg.Wait()
			close(stop)
			opened := wait()
			logLines := strings.Count(d.stderr.String(), "\n")
			t.Logf("attack from %s: %d connections opened; Unix clients %d/%d, TCP clients %d/%d connected within 1 s; %d log lines",
				tc.from, opened, uok, rounds, tok, rounds, logLines)
			if logLines > 200 {
				t.Fatalf("the flood wrote %d log lines: refusals must be rate-limited", logLines)
			}
			if opened < 1000 {
				t.Fatalf("the flood opened only %d connections", opened)
			}
			if float64(uok) < tc.min*rounds || float64(tok) < tc.min*rounds {
				t.Fatalf("legitimate clients locked out: Unix %d/%d %v, TCP %d/%d %v", uok, rounds, uerr, tok, rounds, terr)
			}
		})
	}
}

// idleFlood holds n idle connections to addr from 127.0.0.1 until stop is
// closed: each of n loops dials, sends nothing, waits for the daemon to
// close the connection (or for stop), and dials again at once. It counts
// the connections it opens in opened; the function it returns waits for
// the loops to end.
func idleFlood(addr string, n int, stop <-chan struct{}, opened *atomic.Int64) func() {
	return reopeningFlood(addr, n, stop, opened, nil)
}

// reopeningFlood is idleFlood whose connections first run hello (nil: send
// nothing).
func reopeningFlood(addr string, n int, stop <-chan struct{}, opened *atomic.Int64, hello func(net.Conn)) func() {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
			buf := make([]byte, 512)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					time.Sleep(10 * time.Millisecond) // e.g. out of ephemeral ports: a short pause, not a spin
					continue
				}
				opened.Add(1)
				if hello != nil {
					hello(c)
				}
				done := make(chan struct{})
				go func() {
					select {
					case <-stop:
						c.Close()
					case <-done:
					}
				}()
				for {
					if _, err := c.Read(buf); err != nil {
						break
					}
				}
				close(done)
				c.Close()
			}
		}()
	}
	return wg.Wait
}

// writeSelfSigned writes a certificate for 127.0.0.1 and its key to dir and
// returns their paths and a client config that trusts the certificate.
func writeSelfSigned(t *testing.T, dir string) (certFile, keyFile string, cfg *tls.Config) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "syncmgr flood test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	must(t, err)
	kder, err := x509.MarshalECPrivateKey(priv)
	must(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	must(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	must(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	cert, err := x509.ParseCertificate(der)
	must(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// TestIdleFloodFromTheClientsOwnAddress (issue 22, finding 5): a process
// holding 256 idle TCP connections from 127.0.0.1, the legitimate TCP
// clients' own address, and reopening each the moment the daemon drops it,
// leaves at least 99% of legitimate handshakes (Unix and TCP clients
// together, each connecting and pinging within 1 s) working; on a plain
// and on a TLS port. Idle connections cannot be told from clients by
// address: clients speak first (their ready frame), and the daemon drops
// silent connections before ones that have spoken.
func TestIdleFloodFromTheClientsOwnAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("flood test: skipped in -short")
	}
	for _, withTLS := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "tls"}[withTLS]
		t.Run(name, func(t *testing.T) {
			tcpAddr := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t))
			flags := []string{"--tcp", tcpAddr, "--log-level", "info"}
			var opts []proxy.Option
			if withTLS {
				certFile, keyFile, cfg := writeSelfSigned(t, t.TempDir())
				flags = append(flags, "--tls-cert", certFile, "--tls-key", keyFile)
				opts = append(opts, proxy.WithTLS(cfg))
			}
			d := startDaemon(t, flags...)
			stop := make(chan struct{})
			var flooded atomic.Int64
			wait := idleFlood(tcpAddr, 256, stop, &flooded)
			stopped := false
			defer func() {
				if !stopped {
					close(stop)
					wait()
				}
			}()
			// Let the flood hold its 256 connections and the daemon start
			// dropping them (then it drops one pending handshake for each
			// it accepts from the address).
			sc := d.dial(t)
			deadline := time.Now().Add(bound)
			for {
				h := handshaking(call(t, sc, "status", map[string]any{"limit": 0}))
				if h >= 16 && flooded.Load() > 512 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no flood: %d connections opened, %d handshaking", flooded.Load(), h)
				}
				time.Sleep(50 * time.Millisecond)
			}
			const rounds = 150
			var uok, tok int
			var uerr, terr []string
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); uok, uerr = legit(d.sock, d.keyBytes(), rounds) }()
			go func() { defer wg.Done(); tok, terr = legitWith("tcp://"+tcpAddr, d.keyBytes(), rounds, opts...) }()
			wg.Wait()
			close(stop)
			stopped = true
			wait()
			opened := flooded.Load()
			logLines := strings.Count(d.stderr.String(), "\n")
			t.Logf("%s: idle flood from the clients' address opened %d connections; Unix clients %d/%d, TCP clients %d/%d connected within 1 s; %d log lines",
				name, opened, uok, rounds, tok, rounds, logLines)
			if opened <= 256 {
				t.Fatalf("the daemon dropped none of the %d idle connections (%d opened): no flood", 256, opened)
			}
			if logLines > 200 {
				t.Fatalf("the flood wrote %d log lines: refusals must be rate-limited", logLines)
			}
			if float64(uok+tok) < 0.99*2*rounds {
				t.Fatalf("legitimate clients locked out: Unix %d/%d %v, TCP %d/%d %v", uok, rounds, uerr, tok, rounds, terr)
			}
		})
	}
}

// handshaking reads the number of connections in the handshake from a
// status reply.
func handshaking(st any) int64 {
	m, _ := st.(map[string]any)
	srv, _ := m["server"].(map[string]any)
	switch v := srv["handshaking"].(type) {
	case int64:
		return v
	case uint64:
		return int64(v)
	case int8, int16, int32, uint8, uint16, uint32:
		return reflect.ValueOf(v).Convert(reflect.TypeFor[int64]()).Int()
	}
	return -1
}

// legitWith is legit with dial options (TLS).
func legitWith(address string, key []byte, rounds int, opts ...proxy.Option) (ok int, errs []string) {
	for range rounds {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := proxy.Dial(ctx, address, key, opts...)
		if err == nil {
			_, err = c.Call(ctx, "ping", nil, nil)
			c.Close()
		}
		cancel()
		if err == nil {
			ok++
		} else if len(errs) < 5 {
			errs = append(errs, err.Error())
		}
	}
	return ok, errs
}

// readyFlood holds n connections to addr from 127.0.0.1 that each send a
// client's first frame (ready) and then nothing: until the daemon's hello
// goes unanswered they look like clients. Each loop reopens its connection
// the moment the daemon drops it. It counts the connections it opens in
// opened; the function it returns waits for the loops to end.
func readyFlood(addr string, n int, stop <-chan struct{}, opened *atomic.Int64) func() {
	ready, _ := wire.Marshal(auth.Ready{T: "ready"})
	return reopeningFlood(addr, n, stop, opened, func(c net.Conn) { _ = wire.WriteFrame(c, ready) })
}

// firstTries connects to network/addr up to rounds times, or until
// deadline, each time once (no retry, unlike proxy.Dial): a handshake as
// the clients make it (ready frame first) and a ping, within 1 s. It
// returns how many tries were made and how many succeeded.
func firstTries(network, addr string, key []byte, rounds int, deadline time.Time) (tries, ok int, errs []string) {
	for ; tries < rounds && time.Now().Before(deadline); tries++ {
		err := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var d net.Dialer
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return err
			}
			defer nc.Close()
			dl, _ := ctx.Deadline()
			_ = nc.SetDeadline(dl)
			if _, err := auth.Client(nc, auth.ClientConfig{Key: key, Ready: true, Label: "first-try"}); err != nil {
				return err
			}
			frame, err := wire.EncodeRequest(1, "ping", nil)
			if err != nil {
				return err
			}
			if _, err := nc.Write(frame); err != nil { // the frame has its header
				return err
			}
			body, err := wire.ReadFrame(nc, wire.DefaultMaxFrame)
			if err != nil {
				return err
			}
			rep, err := wire.DecodeReply(body)
			if err == nil && rep.Err != nil {
				err = rep.Err
			}
			return err
		}()
		if err == nil {
			ok++
		} else if len(errs) < 5 {
			errs = append(errs, err.Error())
		}
	}
	return tries, ok, errs
}

// TestReadyFloodFirstTries (issue 31): 64 connections from 127.0.0.1,
// the TCP clients' own address, each sending the ready frame a client
// sends first and then nothing, reopened the moment the daemon drops them,
// against a budget of 32 handshakes, leave at least 99% of legitimate
// clients' first tries (one connection, handshake and ping within 1 s, no
// retry) working, over TCP and over the Unix socket. The ready frame makes
// them look like clients until they leave the daemon's hello unanswered;
// the daemon drops one only then, and makes a newcomer wait rather than
// drop a handshake whose answer may be on its way. Before, a client whose
// answer took longer than the flood took to turn the budget over was
// dropped: 133 and 138 of 150 TCP first tries here under -race on two
// cores (and about 60% with the default budget of 128 against 256
// flooders, without -race, where the daemon accepts faster).
func TestReadyFloodFirstTries(t *testing.T) {
	if testing.Short() {
		t.Skip("flood test: skipped in -short")
	}
	tcpAddr := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t))
	d := startDaemon(t, "--tcp", tcpAddr, "--log-level", "info", "--max-handshakes", "32")
	stop := make(chan struct{})
	var flooded atomic.Int64
	wait := readyFlood(tcpAddr, 64, stop, &flooded)
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			wait()
		}
	}()
	sc := d.dial(t)
	deadline := time.Now().Add(bound)
	for { // the flood fills the budget and the daemon drops its connections
		h := handshaking(call(t, sc, "status", map[string]any{"limit": 0}))
		if h >= 30 && flooded.Load() > 256 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no flood: %d connections opened, %d handshaking", flooded.Load(), h)
		}
		time.Sleep(50 * time.Millisecond)
	}
	const rounds = 150
	end := time.Now().Add(12 * time.Second) // bounds the test's time on a slow machine
	var utries, uok, ttries, tok int
	var uerr, terr []string
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); utries, uok, uerr = firstTries("unix", d.sock, d.keyBytes(), rounds, end) }()
	go func() { defer wg.Done(); ttries, tok, terr = firstTries("tcp", tcpAddr, d.keyBytes(), rounds, end) }()
	wg.Wait()
	close(stop)
	stopped = true
	wait()
	logLines := strings.Count(d.stderr.String(), "\n")
	t.Logf("ready flood from the clients' address: %d connections opened; first tries: Unix %d/%d, TCP %d/%d; %d log lines",
		flooded.Load(), uok, utries, tok, ttries, logLines)
	if utries < 100 || ttries < 100 {
		t.Fatalf("only %d Unix and %d TCP tries in 12 s", utries, ttries)
	}
	if logLines > 200 {
		t.Fatalf("the flood wrote %d log lines: refusals must be rate-limited", logLines)
	}
	if float64(uok) < 0.99*float64(utries) || float64(tok) < 0.99*float64(ttries) {
		t.Fatalf("legitimate first tries failed: Unix %d/%d %v, TCP %d/%d %v", uok, utries, uerr, tok, ttries, terr)
	}
}
