package server

import (
	"bytes"
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
