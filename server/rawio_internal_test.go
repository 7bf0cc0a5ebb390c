package server

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syncmgr/syncmgr/wire"
)

// consume drops written bytes across buffer boundaries.
func TestConsume(t *testing.T) {
	bufs := [][]byte{[]byte("abc"), []byte("de"), nil, []byte("fgh")}
	for _, step := range []struct {
		n    int
		left string
	}{{4, "efgh"}, {1, "fgh"}, {3, ""}} {
		consume(&bufs, step.n)
		if got := string(bytes.Join(bufs, nil)); got != step.left || (len(bufs) > 0 && len(bufs[0]) == 0) {
			t.Fatalf("after %d more: %q, want %q with no empty buffer first", step.n, bufs, step.left)
		}
	}
}

// A raw writer gets a write far larger than the socket's buffer through,
// waiting for the reader whenever the buffer is full, and a raw reader
// reads it back and then sees EOF; on a peer that stops reading, the
// connection's write deadline still ends the write.
func TestRawIOAcrossFullBuffers(t *testing.T) {
	a, b := unixPair(t)
	wa, rb := newRawIO(a), newRawIO(b)
	if wa == nil || rb == nil {
		t.Fatal("no raw I/O for a Unix socket")
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
	done := make(chan error, 1)
	go func() {
		err := wa.writeBuffers([][]byte{[]byte("head"), big, []byte("tail")})
		a.Close()
		done <- err
	}()
	got, err := io.ReadAll(rb)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if want := append(append([]byte("head"), big...), "tail"...); !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d", len(got), len(want))
	}

	c, _ := unixPair(t)
	_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	if err := newRawIO(c).writeBuffers([][]byte{big, big}); err == nil {
		t.Fatal("a write nobody reads outlived its deadline")
	}
}

func unixPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	return connPair(t, "unix", t.TempDir()+"/s")
}

// connPair is a connected pair of sockets of network on a listener at
// addr, both closed when the test ends.
func connPair(t *testing.T, network, addr string) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	a, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-ch
	if b == nil {
		a.Close()
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// tlsListener is the daemon's TLS listener on a loopback port, with a
// certificate of its own; the test closes it at its end.
func tlsListener(t *testing.T) net.Listener {
	t.Helper()
	cfg, _, err := SelfSignedTLS("127.0.0.1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := ListenTCP("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// A TLS connection's records go through raw I/O once the sniff read is
// done: 4 MiB each way across full socket buffers, and a read deadline
// still ends a read that nothing answers, as a timeout.
func TestTLSRecordsUseRawIO(t *testing.T) {
	ln := tlsListener(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18)
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		if sc, ok := c.(*tls.Conn).NetConn().(*sniffConn); !ok || sc.raw == nil {
			served <- errors.New("the accepted TLS connection has no raw I/O")
			return
		}
		got := make([]byte, len(big))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, big) {
			served <- errors.Join(errors.New("the server read other bytes"), err)
			return
		}
		if _, err := c.Write(got); err != nil {
			served <- err
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		var ne net.Error
		if _, err := c.Read(got[:1]); !errors.As(err, &ne) || !ne.Timeout() {
			served <- errors.Join(errors.New("a read past its deadline did not time out"), err)
			return
		}
		served <- nil
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a test's own certificate
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(big); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(big))
	if _, err := io.ReadFull(c, back); err != nil || !bytes.Equal(back, big) {
		t.Fatalf("read back: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	a, b := connPair(t, "tcp", "127.0.0.1:0")
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

func rcvLowat(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// While a large body is still to come, a reader that finds its socket
// empty is woken only once lowatMax bytes have come (SO_RCVLOWAT), not at
// each arrival; the body's end sets the socket back at once; with less
// than lowatMin to come, each arrival wakes the reader again; a peer's
// close wakes it at once however much was expected.
func TestLargeBodyWakesTheReaderOnce(t *testing.T) {
	a, b := tcpPair(t)
	r := newRawIO(b)
	if r == nil || !r.tcp {
		t.Fatal("no raw I/O for a TCP socket")
	}
	type result struct {
		n   int
		err error
	}
	read := func(p []byte) chan result {
		ch := make(chan result, 1)
		go func() {
			n, err := r.Read(p)
			ch <- result{n, err}
		}()
		return ch
	}
	waitLowat := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); rcvLowat(t, b) != want; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("SO_RCVLOWAT is %d, want %d", rcvLowat(t, b), want)
			}
		}
	}
	_ = b.SetReadDeadline(time.Now().Add(10 * time.Second))
	p := make([]byte, 1<<20)
	r.expect(1 << 20)
	got := read(p)
	waitLowat(lowatMax)
	if _, err := a.Write(make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-got:
		t.Fatalf("the reader woke for %d bytes of a 1 MiB body (err %v)", res.n, res.err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := a.Write(make([]byte, 200<<10)); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if res.err != nil || res.n < lowatMax {
		t.Fatalf("read %d bytes (%v), want at least %d", res.n, res.err, lowatMax)
	}
	if want := 1<<20 - res.n; r.need != want {
		t.Fatalf("need %d after the read, want %d", r.need, want)
	}

	r.expect(0) // the body's end: at once, not at the next wait
	if v := rcvLowat(t, b); v != 1 {
		t.Fatalf("SO_RCVLOWAT is %d after the body's end, where an event loop would wait for a small request", v)
	}
	r.expect(lowatMin - 1) // too little to wait for: each arrival wakes
	got = read(p)
	waitLowat(1)
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if res := <-got; res.err != nil || res.n != 1 {
		t.Fatalf("read %d bytes (%v), want 1", res.n, res.err)
	}

	r.expect(1 << 20)
	got = read(p)
	waitLowat(lowatMax)
	a.Close()
	select {
	case res := <-got:
		if !errors.Is(res.err, io.EOF) {
			t.Fatalf("after the peer closed: %d bytes, %v; want EOF", res.n, res.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's close did not wake a reader waiting for more than had come")
	}
}

// What the loop tells a TLS connection's socket to expect of a body is
// never more than the socket then delivers until the body is read (else a
// reader would wait for bytes that never come): frames of many sizes,
// written whole or in pieces, each read as the loop reads it, against the
// crypto/tls in use. This is the check of tlsHeld.
func TestTLSHoldsNoMoreThanTlsHeld(t *testing.T) {
	ln := tlsListener(t)
	sizes := []int{100, 1 << 20, 200 << 10, 5 << 20, tlsHeld + lowatMin, 130 << 10, 1<<20 + 7, 3 << 20, 64 << 10, 2 << 20}
	acks := make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a test's own certificate
		if err != nil {
			sent <- err
			return
		}
		defer c.Close()
		for i, n := range sizes {
			frame := make([]byte, 4+n)
			binary.BigEndian.PutUint32(frame, uint32(n))
			for j := range n {
				frame[4+j] = byte(i + j)
			}
			pieces := [][]byte{frame}
			if i%2 == 1 { // as the Python client writes an item: header and envelope, then the item
				pieces = [][]byte{frame[:4], frame[4:20], frame[20 : 20+n/2], frame[20+n/2:]}
			}
			for _, p := range pieces {
				if _, err := c.Write(p); err != nil {
					sent <- err
					return
				}
			}
			<-acks
		}
		sent <- nil
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	under := tlsRecords(c)
	if under == nil || !under.tcp {
		t.Fatal("a TLS connection's socket has no raw I/O")
	}
	br := bufio.NewReaderSize(c, 64<<10)
	for i, size := range sizes {
		n, err := wire.ReadHeader(br)
		if err != nil || int(n) != size {
			t.Fatalf("frame %d: header %d (%v), want %d", i, n, err, size)
		}
		under.expect(int(n) - br.Buffered() - tlsHeld)
		told := under.need
		body, err := wire.ReadBodyAsItArrives(br, n)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if under.need != 0 {
			t.Fatalf("frame %d of %d bytes: the socket was told to expect %d bytes, %d more than it delivered", i, size, told, under.need)
		}
		for j, v := range body {
			if v != byte(i+j) {
				t.Fatalf("frame %d: byte %d is %d", i, j, v)
			}
		}
		under.expect(0)
		acks <- struct{}{}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}
