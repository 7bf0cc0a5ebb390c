package server

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"
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
	path := t.TempDir() + "/s"
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	a, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	b := <-ch
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// A TLS connection's records go through raw I/O once the sniff read is
// done: 4 MiB each way across full socket buffers, and a read deadline
// still ends a read that nothing answers, as a timeout.
func TestTLSRecordsUseRawIO(t *testing.T) {
	cfg, _, err := SelfSignedTLS("127.0.0.1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := ListenTCP("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
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
