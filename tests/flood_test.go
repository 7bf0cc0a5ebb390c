package tests

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
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
// 127.0.0.2, the TCP clients from 127.0.0.1. With the attacker on the
// clients' own address, TCP clients must still get through 90% of the time
// (measured: 99.5%; see docs/reliability.md).
func TestHandshakeFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("flood test: skipped in -short")
	}
	for _, tc := range []struct {
		name, from string
		min        float64
	}{{"other-source", "127.0.0.2", 0.99}, {"same-source", "127.0.0.1", 0.9}} {
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
