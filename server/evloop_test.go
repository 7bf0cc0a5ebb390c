package server_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/wire"
)

// everyServing runs fn on a server whose connections are served by event
// loops (the default), on one that serves each by a goroutine of its own
// (EventLoops < 0), and on a TLS listener served either way (the loops:
// evloop_tls.go).
func everyServing(t *testing.T, fn func(t *testing.T, ts *testServer), opts ...func(*serverOpts)) {
	goroutines := func(o *serverOpts) { o.cfg.EventLoops = -1 }
	t.Run("loop", func(t *testing.T) { fn(t, startServer(t, opts...)) })
	t.Run("goroutine", func(t *testing.T) { fn(t, startServer(t, append(opts, goroutines)...)) })
	t.Run("tls-loop", func(t *testing.T) { fn(t, startServer(t, append(opts, overTLS)...)) })
	t.Run("tls-goroutine", func(t *testing.T) { fn(t, startServer(t, append(opts, overTLS, goroutines)...)) })
}

// Replies that a client never reads and whose connection then ends give
// their items back: a get granted but not delivered takes nothing, and the
// queue keeps its order. Over a Unix socket, whose buffers take less than
// one of these items, every item comes back. Over TCP the kernel's buffers
// take megabytes, and a reply in them counts as delivered: what comes back
// is the rest, in order.
func TestRepliesNotSentAreUndone(t *testing.T) {
	everyServing(t, func(t *testing.T, ts *testServer) {
		other := ts.dial(t)
		call(t, other, "create", obj("queue", "U"))
		n := 6
		if ts.tls != nil {
			n = 24 // more than the two ends' TCP buffers and the loop's output limit take
		}
		for i := range n {
			call(t, other, "put", obj("queue", "U", "item", bytes.Repeat([]byte{byte('a' + i)}, 1<<20)))
		}
		r := ts.raw(t, nil)
		for i := range n {
			r.send(uint64(i+1), "get", obj("queue", "U", "block", false)) // never read
		}
		deadline := time.Now().Add(bound)
		for call(t, other, "qsize", obj("queue", "U")) == int64(n) { // at least one get happened
			if time.Now().After(deadline) {
				t.Fatal("no get of the raw client happened")
			}
			time.Sleep(time.Millisecond)
		}
		r.nc.Close()
		ts.waitSessions(t, 1)
		left := int(call(t, other, "qsize", obj("queue", "U")).(int64))
		if left == 0 || ts.tls == nil && left != n {
			t.Fatalf("%d of %d items back after the client left", left, n)
		}
		for i := n - left; i < n; i++ {
			got, _ := call(t, other, "get", obj("queue", "U", "timeout", 5)).([]byte)
			if len(got) != 1<<20 || got[0] != byte('a'+i) {
				t.Fatalf("item %d after the client left: %d bytes of %q, want the %q item", i, len(got), got[:min(len(got), 1)], string(rune('a'+i)))
			}
		}
		t.Logf("%d of %d items back", left, n)
	})
}

// A client that sends requests and reads no replies is not read from once
// its replies back up: its own writes stall (the daemon holds a bounded
// amount for it), and every other client is served meanwhile. The write
// timeout then ends it.
func TestClientThatDoesNotReadIsNotRead(t *testing.T) {
	everyServing(t, func(t *testing.T, ts *testServer) {
		other := ts.dial(t)
		call(t, other, "create", obj("dict", "D"))
		call(t, other, "set", obj("dict", "D", "key", []byte("k"), "kp", []byte("k"), "value", make([]byte, 256<<10)))
		r := ts.raw(t, nil)
		frame, err := wire.EncodeRequest(1, "get", obj("dict", "D", "key", []byte("k")))
		if err != nil {
			t.Fatal(err)
		}
		stalled := make(chan int, 1)
		go func() {
			sent := 0
			for sent < 1<<20 { // 256 GiB of replies: far more than any buffer
				_ = r.nc.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
				if _, err := r.nc.Write(frame); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						stalled <- sent
						return
					}
					stalled <- -1
					return
				}
				sent++
			}
			stalled <- -2
		}()
		select {
		case sent := <-stalled:
			if sent < 0 {
				t.Fatalf("the silent client's writes did not stall (%d)", sent)
			}
			t.Logf("the silent client's writes stalled after %d requests", sent)
		case <-time.After(4 * bound):
			t.Fatal("the silent client's writes never stalled: the daemon buffers without bound")
		}
		for i := range 50 { // everyone else is served
			call(t, other, "set", obj("dict", "D", "key", []byte(fmt.Sprint(i)), "kp", []byte("k"), "value", []byte("v")))
		}
		ts.waitSessions(t, 1) // the write timeout ends the silent client
	}, func(o *serverOpts) { o.cfg.WriteTimeout = 2 * time.Second })
}

// Many connections spread over several loops, each pipelining requests:
// every connection's replies come back in the order of its requests, and
// every effect is there. The same over TLS.
func TestLoopsKeepEachConnectionsOrder(t *testing.T) {
	threeLoops := func(o *serverOpts) { o.cfg.EventLoops = 3 }
	t.Run("unix", func(t *testing.T) { testLoopsKeepOrder(t, startServer(t, threeLoops)) })
	t.Run("tls", func(t *testing.T) { testLoopsKeepOrder(t, startServer(t, threeLoops, overTLS)) })
}

func testLoopsKeepOrder(t *testing.T, ts *testServer) {
	other := ts.dial(t)
	call(t, other, "create", obj("dict", "O"))
	const conns, reqs = 12, 300
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for c := range conns {
		r := ts.raw(t, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf bytes.Buffer
			for i := range reqs {
				f, err := wire.EncodeRequest(uint64(i+1), "set", obj("dict", "O", "key", []byte(fmt.Sprint(c)), "kp",
					[]byte("k"), "value", []byte(fmt.Sprint(i))))
				if err != nil {
					errs <- err
					return
				}
				buf.Write(f)
			}
			if _, err := r.nc.Write(buf.Bytes()); err != nil { // all at once, then read
				errs <- err
				return
			}
			_ = r.nc.SetReadDeadline(time.Now().Add(bound))
			for i := range reqs {
				body, err := wire.ReadFrame(r.nc, wire.DefaultMaxFrame)
				if err != nil {
					errs <- err
					return
				}
				rep, err := wire.DecodeReply(body)
				if err != nil || rep.Err != nil || rep.ID != uint64(i+1) {
					errs <- fmt.Errorf("conn %d: reply %d is %+v (%v), want id %d", c, i, rep, err, i+1)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for c := range conns {
		got, _ := call(t, other, "get", obj("dict", "O", "key", []byte(fmt.Sprint(c)))).([]byte)
		if string(got) != fmt.Sprint(reqs-1) {
			t.Fatalf("conn %d's last set: %q, want %q", c, got, fmt.Sprint(reqs-1))
		}
	}
}

// writeCalls is this process's count of write system calls so far
// (/proc/self/io's syscw), which the in-process server's replies add to.
func writeCalls(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no syscw in /proc/self/io")
	return 0
}

// Requests that arrive together (a pipelining client's, in one write) are
// answered together: a loop writes their replies in one writev, not one
// write each. Each reply still carries its own request's result, and a
// request that parks is answered when it ends. The same over TLS, whose
// records crypto/tls holds beyond what epoll sees.
func TestPipelinedRepliesGoOutTogether(t *testing.T) {
	t.Run("unix", func(t *testing.T) { testPipelinedReplies(t, startServer(t)) })
	t.Run("tls", func(t *testing.T) { testPipelinedReplies(t, startServer(t, overTLS)) })
}

func testPipelinedReplies(t *testing.T, ts *testServer) {
	other := ts.dial(t)
	call(t, other, "create", obj("queue", "P"))
	r := ts.raw(t, nil)
	const n = 64
	var buf bytes.Buffer
	for i := range n {
		var f []byte
		var err error
		if i%2 == 0 {
			f, err = wire.EncodeRequest(uint64(i+1), "put", obj("queue", "P", "item", []byte(fmt.Sprint(i))))
		} else {
			f, err = wire.EncodeRequest(uint64(i+1), "get", obj("queue", "P", "block", false))
		}
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(f)
	}
	parked, err := wire.EncodeRequest(n+1, "get", obj("queue", "P", "timeout", 10))
	if err != nil {
		t.Fatal(err)
	}
	buf.Write(parked)
	before := writeCalls(t)
	if _, err := r.nc.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		rep := r.recv()
		if rep.ID != uint64(i+1) || rep.Err != nil {
			t.Fatalf("reply %d: %+v, want id %d and no error", i, rep, i+1)
		}
		if i%2 == 1 {
			if got, _ := rep.Result.([]byte); string(got) != fmt.Sprint(i-1) {
				t.Fatalf("get %d got %q, want %q", i, got, fmt.Sprint(i-1))
			}
		}
	}
	writes := writeCalls(t) - before
	if writes > n/4 {
		t.Fatalf("%d write calls for %d pipelined replies: they went out one by one", writes, n)
	}
	call(t, other, "put", obj("queue", "P", "item", []byte("late")))
	if rep := r.recv(); rep.ID != n+1 || rep.Err != nil || string(rep.Result.([]byte)) != "late" {
		t.Fatalf("the parked get's reply: %+v", rep)
	}
}

// A client that sends many requests, each in a write of its own, before it
// reads any of their large replies: the loop stops reading it while a
// megabyte of replies waits, and once the client reads, every reply comes,
// in order. Over TLS the requests not yet read may all be held by
// crypto/tls, out of epoll's sight: the loop reads them on its own once the
// replies have drained.
func TestBackedUpClientGetsEveryReply(t *testing.T) {
	for _, tr := range []struct {
		name string
		opts []func(*serverOpts)
	}{{"unix", nil}, {"tls", []func(*serverOpts){overTLS}}} {
		t.Run(tr.name, func(t *testing.T) {
			ts := startServer(t, tr.opts...)
			other := ts.dial(t)
			call(t, other, "create", obj("dict", "B"))
			value := bytes.Repeat([]byte("v"), 256<<10)
			call(t, other, "set", obj("dict", "B", "key", []byte("k"), "kp", []byte("k"), "value", value))
			r := ts.raw(t, nil)
			const n = 64 // 16 MiB of replies
			for i := range n {
				r.send(uint64(i+1), "get", obj("dict", "B", "key", []byte("k")))
			}
			time.Sleep(50 * time.Millisecond) // the replies back up meanwhile
			for i := range n {
				rep := r.recv()
				if rep.ID != uint64(i+1) || rep.Err != nil || !bytes.Equal(rep.Result.([]byte), value) {
					t.Fatalf("reply %d: id %d, error %v, want id %d and the value", i, rep.ID, rep.Err, i+1)
				}
			}
		})
	}
}

// A TLS client that sends many small requests, each in a record of its own
// and all before it reads: the loop reads them over many turns (crypto/tls
// holds most of them out of epoll's sight, and a turn ends after
// tlsTurnReads records), and every reply comes, in order, while another
// client on the same loop is served meanwhile.
func TestManySmallTLSRecordsAreAllServed(t *testing.T) {
	ts := startServer(t, overTLS, func(o *serverOpts) { o.cfg.EventLoops = 1 })
	other := ts.dial(t)
	call(t, other, "create", obj("dict", "R"))
	r := ts.raw(t, nil)
	const n = 2000
	done := make(chan error, 1)
	go func() {
		for i := range n {
			f, err := wire.EncodeRequest(uint64(i+1), "set", obj("dict", "R", "key", []byte("k"), "kp", []byte("k"),
				"value", []byte(fmt.Sprint(i))))
			if err == nil {
				_, err = r.nc.Write(f) // one record each
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range 20 { // the other client meanwhile
		call(t, other, "set", obj("dict", "R", "key", []byte("o"), "kp", []byte("k"), "value", []byte("o")))
	}
	for i := range n {
		if rep := r.recv(); rep.ID != uint64(i+1) || rep.Err != nil {
			t.Fatalf("reply %d: %+v, want id %d", i, rep, i+1)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, _ := call(t, other, "get", obj("dict", "R", "key", []byte("k"))).([]byte); string(got) != fmt.Sprint(n-1) {
		t.Fatalf("the last set: %q", got)
	}
}
