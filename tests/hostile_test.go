package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

const (
	hsTimeout     = 500 * time.Millisecond
	maxHandshakes = 8
	maxFrame      = 65536
)

// hdr is a frame header announcing n bytes.
func hdr(n uint32) []byte { return []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)} }

// TestHostileInput attacks a running daemon in many ways while a
// well-behaved client keeps its objects and keeps being served.
func TestHostileInput(t *testing.T) {
	d := startDaemon(t, "--handshake-timeout", hsTimeout.String(), "--max-handshakes", strconv.Itoa(maxHandshakes),
		"--max-frame", strconv.Itoa(maxFrame), "--max-queue", "1000")
	good := d.dial(t, proxy.WithLabel("good"))
	call(t, good, "create", obj("lock", "held"))
	call(t, good, "acquire", obj("lock", "held", "tid", 1))
	call(t, good, "create", obj("value", "v", "typecode", "q", "value", 42))
	call(t, good, "create", obj("queue", "q"))
	call(t, good, "put", obj("queue", "q", "item", []byte("a")))
	call(t, good, "put", obj("queue", "q", "item", []byte("b")))
	call(t, good, "create", obj("event", "e"))
	call(t, good, "set", obj("event", "e"))
	call(t, good, "create", obj("queue", "empty"))

	// check: the good client is served and its objects are as it left them.
	check := func(t *testing.T) {
		t.Helper()
		call(t, good, "ping", nil)
		if v := call(t, good, "get", obj("value", "v")); v != int64(42) {
			t.Fatalf("value is %v", v)
		}
		if n := call(t, good, "qsize", obj("queue", "q")); n != int64(2) {
			t.Fatalf("queue holds %v items", n)
		}
		if call(t, good, "is_set", obj("event", "e")) != true {
			t.Fatal("event cleared")
		}
		if call(t, good, "acquire", obj("lock", "held", "tid", 2, "block", false)) != false {
			t.Fatal("the good client's lock was released")
		}
		// A fresh client still gets in.
		c := d.dial(t)
		call(t, c, "ping", nil)
		c.Close()
	}

	for _, tc := range hostileCases(d, good) {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t)
			check(t)
		})
	}

	// Every hostile connection is gone; only the good client's session is
	// left, with nothing waiting.
	deadline := time.Now().Add(bound)
	for {
		st := call(t, good, "status", nil).(map[string]any)
		sessions := st["sessions"].([]any)
		waiters := int64(0)
		for _, o := range st["objects"].([]any) {
			waiters += o.(map[string]any)["waiters"].(int64)
		}
		srv := st["server"].(map[string]any)
		if len(sessions) == 1 && waiters == 0 && srv["handshaking"] == int64(0) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %d sessions, %d waiters, %v handshaking", len(sessions), waiters, srv["handshaking"])
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Nothing ever made the daemon allocate what a frame claimed.
	if hwm := peakRSS(t, d.cmd.Process.Pid); hwm > 1<<30 {
		t.Fatalf("daemon peak RSS %d MiB", hwm>>20)
	}
}

// peakRSS reads VmHWM of a process, in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

type hostileCase struct {
	name string
	fn   func(t *testing.T)
}

// hostileCases are the attacks; good is the well-behaved client's
// connection, authenticated before any of them.
func hostileCases(d *daemon, good *proxy.Client) []hostileCase {
	// afterHandshake sends body as one frame on an authenticated connection
	// and expects an id-0 error with code, then the connection closed.
	refusedAfterHandshake := func(t *testing.T, raw []byte, want wire.Code) {
		t.Helper()
		r := d.raw(t)
		r.send(1, "ping", nil) // the connection works before
		if rep := r.recv(); rep.ID != 1 || rep.Err != nil {
			t.Fatalf("ping: %+v", rep)
		}
		start := time.Now()
		r.write(raw)
		rep := r.recv()
		if rep.ID != 0 || rep.Err == nil || rep.Err.Code != want {
			t.Fatalf("got %+v, want an id-0 %s error", rep, want)
		}
		r.closed(bound)
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("took %v", el)
		}
	}
	frame := func(body []byte) []byte { return append(hdr(uint32(len(body))), body...) }
	// answers sends requests on one connection and checks each answer's
	// code, and that the connection stays usable.
	answers := func(t *testing.T, reqs []request) {
		t.Helper()
		r := d.raw(t)
		for i, q := range reqs {
			r.send(uint64(i+1), q.op, q.args)
			rep := r.recv()
			if rep.ID != uint64(i+1) {
				t.Fatalf("%s %v: reply id %d", q.op, q.args, rep.ID)
			}
			got := wire.Code("")
			if rep.Err != nil {
				got = rep.Err.Code
			}
			if got != q.code {
				t.Errorf("%s %.80v: got %v (%v), want %q", q.op, q.args, got, rep.Err, q.code)
			}
		}
		r.send(1000, "ping", nil)
		if rep := r.recv(); rep.ID != 1000 || rep.Err != nil {
			t.Fatalf("connection unusable after bad requests: %+v", rep)
		}
	}

	return []hostileCase{
		{"wrong key", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			if _, err := proxy.Dial(ctx, d.sock, []byte("not the key")); !errors.Is(err, proxy.ErrAuthFailed) {
				t.Fatalf("got %v", err)
			}
			r := d.connect(t)
			body, _ := r.frame()
			var h auth.Hello
			wire.Unmarshal(body, &h)
			nc := make([]byte, 32)
			b, _ := wire.Marshal(auth.Auth{T: "auth", Version: 1, Nonce: nc, MAC: auth.MAC([]byte("guess"), auth.ClientLabel, h.Nonce, nc)})
			r.write(frame(b))
			if c := r.handshakeError(); c != "auth_failed" {
				t.Fatalf("code %q", c)
			}
			r.closed(bound)
		}},
		{"empty auth", func(t *testing.T) {
			for _, body := range [][]byte{nil, {0x80}, {0xc0}, {0xa0}} {
				r := d.connect(t)
				r.frame()
				r.write(append(hdr(uint32(len(body))), body...))
				if c := r.handshakeError(); c != "bad_request" {
					t.Fatalf("auth %x: code %q", body, c)
				}
				r.closed(bound)
			}
		}},
		{"garbage before the handshake", func(t *testing.T) {
			for _, g := range [][]byte{[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), randomBytes(4096), {0, 0, 0, 5, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1}} {
				r := d.connect(t)
				r.write(g) // without even reading the hello
				if el := r.closed(bound); el > 3*time.Second {
					t.Fatalf("closed after %v", el)
				}
			}
		}},
		{"garbage after the handshake", func(t *testing.T) {
			for _, g := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), randomBytes(8192), bytes.Repeat([]byte{0}, 64)} {
				r := d.raw(t)
				r.write(g)
				r.closed(bound)
			}
		}},
		{"4 GiB frame header", func(t *testing.T) {
			r := d.connect(t)
			r.frame()
			r.write(hdr(0xffffffff))
			if c := r.handshakeError(); c != "too_large" {
				t.Fatalf("before the handshake: code %q", c)
			}
			r.closed(bound)
			// After the handshake an oversized frame is skipped and answered
			// under its request id (TestOversizedFrameSkipped in server);
			// one whose body does not start with a request id is refused.
			refusedAfterHandshake(t, append(hdr(0xffffffff), make([]byte, wire.MaxIDPrefix)...), wire.CodeTooLarge)
			refusedAfterHandshake(t, append(hdr(maxFrame+1), make([]byte, 100)...), wire.CodeTooLarge)

			// A well-formed request over the limit: answered under its id,
			// skipped, and the connection goes on.
			r2 := d.raw(t)
			r2.send(7, "ping", map[string]any{"pad": make([]byte, maxFrame+100)})
			if rep := r2.recv(); rep.ID != 7 || rep.Err == nil || rep.Err.Code != wire.CodeTooLarge {
				t.Fatalf("oversized ping: %+v, want too_large for id 7", rep)
			}
			r2.send(8, "ping", nil)
			if rep := r2.recv(); rep.ID != 8 || rep.Err != nil {
				t.Fatalf("ping after the oversized frame: %+v", rep)
			}
		}},
		{"msgpack claiming 2 GiB", func(t *testing.T) {
			// Before the handshake: the auth message's nonce claims 2 GiB.
			r := d.connect(t)
			r.frame()
			start := time.Now()
			r.write(frame([]byte{0x82, 0xa1, 't', 0xa4, 'a', 'u', 't', 'h', 0xa5, 'n', 'o', 'n', 'c', 'e', 0xc6, 0x7f, 0xff, 0xff, 0xff}))
			if c := r.handshakeError(); c != "bad_request" {
				t.Fatalf("code %q", c)
			}
			if el := time.Since(start); el > time.Second {
				t.Fatalf("took %v", el)
			}
			// After it: an argument claims 2 GiB, or 4 G elements.
			refusedAfterHandshake(t, frame([]byte{0x93, 0x01, 0xa1, 'x', 0x81, 0xa1, 'k', 0xc6, 0x7f, 0xff, 0xff, 0xff}), wire.CodeBadRequest)
			refusedAfterHandshake(t, frame([]byte{0x93, 0x01, 0xdb, 0x7f, 0xff, 0xff, 0xff}), wire.CodeBadRequest)
			refusedAfterHandshake(t, frame([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}), wire.CodeBadRequest)
		}},
		{"silent client", func(t *testing.T) {
			r := d.connect(t)
			if _, err := r.frame(); err != nil {
				t.Fatalf("no hello: %v", err)
			}
			el := r.closed(bound)
			if el < hsTimeout/2 || el > 3*time.Second {
				t.Fatalf("silent client closed after %v (handshake timeout %v)", el, hsTimeout)
			}
		}},
		{"silent client after half an auth", func(t *testing.T) {
			r := d.connect(t)
			r.frame()
			r.write(append(hdr(100), 0x85, 0xa1)) // and never the rest
			if el := r.closed(bound); el > 3*time.Second {
				t.Fatalf("closed after %v", el)
			}
		}},
		{"many silent clients", func(t *testing.T) {
			const n = 3 * maxHandshakes
			rs := make([]*rawConn, n)
			for i := range rs {
				rs[i] = d.connect(t)
			}
			// The authenticated client is served while the handshake slots
			// are full; newcomers push the oldest silent ones out, so no more
			// than the cap are ever pending, and every silent one is closed.
			call(t, good, "ping", nil)
			st := call(t, good, "status", nil).(map[string]any)
			if h := st["server"].(map[string]any)["handshaking"].(int64); h > maxHandshakes {
				t.Fatalf("%d connections in the handshake; cap %d", h, maxHandshakes)
			}
			var wg sync.WaitGroup
			for _, r := range rs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r.closed(bound)
				}()
			}
			wg.Wait()
			waitHandshakes(t, good)
		}},
		{"unknown ops", func(t *testing.T) {
			answers(t, []request{
				{"frobnicate", nil, wire.CodeUnknownOp},
				{"", nil, wire.CodeUnknownOp},
				{strings.Repeat("x", 10<<10), nil, wire.CodeUnknownOp},
				{"explode", obj("lock", "held"), wire.CodeUnknownOp},
				{"get", obj("lock", "held"), wire.CodeUnknownOp},
				{"acquire", obj("widget", "held"), wire.CodeBadRequest},
				{"shm_create", map[string]any{"size": 10}, wire.CodeUnknownOp}, // registry disabled
			})
		}},
		{"wrong argument types", func(t *testing.T) {
			answers(t, []request{
				{"create", map[string]any{"kind": 5, "name": "x"}, wire.CodeBadRequest},
				{"create", map[string]any{"kind": "lock", "name": []byte("x")}, wire.CodeBadRequest},
				{"create", obj("semaphore", "s", "value", 1.5), wire.CodeBadRequest},
				{"create", obj("queue", "qq", "maxsize", "10"), wire.CodeBadRequest},
				{"create", obj("value", "vv", "typecode", 1), wire.CodeBadRequest},
				{"acquire", obj("lock", "held", "tid", "x"), wire.CodeBadRequest},
				{"acquire", obj("lock", "held", "block", 1), wire.CodeBadRequest},
				{"put", obj("queue", "q", "item", "str"), wire.CodeBadRequest},
				{"put", obj("queue", "q", "item", 5), wire.CodeBadRequest},
				{"unget", obj("queue", "q"), wire.CodeBadRequest},
				{"set", obj("value", "v", "value", "str"), wire.CodeTypeError},
				{"set", obj("value", "v", "value", []byte{1}), wire.CodeTypeError},
				{"set", obj("value", "v", "value", 1.5), wire.CodeTypeError},
				{"set", obj("value", "v", "value", uint64(math.MaxUint64)), wire.CodeValueError},
				{"add", obj("value", "v", "delta", "1"), wire.CodeTypeError},
				{"cas", obj("value", "v", "expected", "a", "new", 1), wire.CodeTypeError},
				{"wait", obj("event", "e", "timeout", true), wire.CodeBadRequest},
				{"cancel", map[string]any{"id": "x"}, wire.CodeBadRequest},
				{"status", map[string]any{"limit": "x"}, wire.CodeBadRequest},
				{"delete", map[string]any{"name": 5}, wire.CodeBadRequest},
				{"acquire", map[string]any{"kind": "lock", "name": 5}, wire.CodeBadRequest},
			})
		}},
		{"bad timeouts", func(t *testing.T) {
			var reqs []request
			for _, to := range []any{-1, -0.001, math.NaN(), math.Inf(1), math.Inf(-1), int64(math.MinInt64)} {
				reqs = append(reqs,
					request{"acquire", obj("lock", "held", "tid", 9, "timeout", to), wire.CodeValueError},
					request{"get", obj("queue", "empty", "timeout", to), wire.CodeValueError},
					request{"put", obj("queue", "q", "item", []byte("x"), "timeout", to), wire.CodeValueError},
					request{"wait", obj("event", "e", "timeout", to), wire.CodeValueError})
			}
			answers(t, reqs)
		}},
		{"huge sizes", func(t *testing.T) {
			answers(t, []request{
				{"create", obj("queue", "h1", "maxsize", int64(1)<<62), wire.CodeValueError},
				{"create", obj("queue", "h2", "maxsize", 1001), wire.CodeValueError},
				{"create", obj("queue", "h3", "maxsize", uint64(math.MaxUint64)), wire.CodeValueError},
				{"create", obj("joinable_queue", "h4", "maxsize", int64(math.MaxInt64)), wire.CodeValueError},
				{"create", obj("semaphore", "h5", "value", -5), wire.CodeValueError},
				{"create", obj("barrier", "h6", "parties", 0), wire.CodeValueError},
				{"status", map[string]any{"limit": int64(math.MaxInt64)}, ""},
				{"status", map[string]any{"limit": -1}, ""},
			})
		}},
		{"container items claiming huge sizes", func(t *testing.T) {
			call(t, good, "create", obj("dict", "d"))
			call(t, good, "create", obj("list", "l"))
			var reqs []request
			for _, items := range [][]byte{
				{0xdd, 0x7f, 0xff, 0xff, 0xff},
				{0x91, 0x93, 0xc6, 0x7f, 0xff, 0xff, 0xff},
				{0x92, 0xc4, 0x01, 'a', 0xc6, 0x7f, 0xff, 0xff, 0xff},
			} {
				reqs = append(reqs,
					request{"update", obj("dict", "d", "items", items), wire.CodeBadRequest},
					request{"extend", obj("list", "l", "items", items), wire.CodeBadRequest},
					request{"replace", obj("list", "l", "items", items), wire.CodeBadRequest})
			}
			answers(t, reqs)
		}},
		{"bad names", func(t *testing.T) {
			var reqs []request
			for _, n := range []string{"/", "/etc/passwd", "a/b", "..", ".", "../x", "a\x00b", "\x00", strings.Repeat("n", 10<<10), "anon-lock-x", "sp ace", "ü"} {
				reqs = append(reqs,
					request{"create", obj("lock", n), wire.CodeBadName},
					request{"acquire", obj("lock", n, "block", false), wire.CodeNoSuchObject})
			}
			answers(t, reqs)
		}},
		{"malformed msgpack in valid frames", func(t *testing.T) {
			for _, body := range [][]byte{
				{0xc1},
				{0x93},
				{0x92, 0x01, 0xa4, 'p', 'i', 'n', 'g'},
				{0x93, 0xa4, 'p', 'i', 'n', 'g', 0x01, 0x80},
				{0x93, 0x01, 0xc4, 0x04, 'p', 'i', 'n', 'g', 0x80},
				{0x93, 0x01, 0xa4, 'p', 'i', 'n', 'g', 0x80, 0x00},
				{0x93, 0x01, 0xa4, 'p', 'i', 'n', 'g', 0x81, 0x01, 0x02},
				{0x93, 0x01, 0xa4, 'p', 'i', 'n', 'g', 0x81, 0xa1, 'k', 0x91, 0x01},
				{0x93, 0xff, 0xa4, 'p', 'i', 'n', 'g', 0x80},
				bytes.Repeat([]byte{0x91}, 4000),
			} {
				refusedAfterHandshake(t, frame(body), wire.CodeBadRequest)
			}
		}},
		{"pipelined flood", func(t *testing.T) {
			r := d.raw(t)
			var buf bytes.Buffer
			const n = 2000
			for i := 1; i <= n; i++ {
				f, _ := wire.EncodeRequest(uint64(i), "qsize", obj("queue", "q"))
				buf.Write(f)
			}
			go r.nc.Write(buf.Bytes())
			for i := 1; i <= n; i++ {
				if rep := r.recv(); rep.ID != uint64(i) || rep.Result != int64(2) {
					t.Fatalf("reply %d: %+v", i, rep)
				}
			}
		}},
		{"byte by byte", func(t *testing.T) {
			r := d.raw(t)
			f, _ := wire.EncodeRequest(7, "get", obj("value", "v"))
			for _, b := range f {
				r.write([]byte{b})
				time.Sleep(time.Millisecond)
			}
			if rep := r.recv(); rep.ID != 7 || rep.Result != int64(42) {
				t.Fatalf("%+v", rep)
			}
		}},
		{"clients vanishing while parked", func(t *testing.T) {
			for i := 0; i < 5; i++ {
				r := d.raw(t)
				r.send(1, "acquire", obj("lock", "held", "tid", 5))
				r.send(2, "get", obj("queue", "empty"))
				r.send(3, "wait", obj("event", "e", "timeout", 0)) // answered at once
				if rep := r.recv(); rep.ID != 3 {
					t.Fatalf("%+v", rep)
				}
				r.nc.Close()
			}
			waitNoWaiters(t, d)
		}},
	}
}

type request struct {
	op   string
	args map[string]any
	code wire.Code
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// waitHandshakes waits until no connection is in the handshake.
func waitHandshakes(t *testing.T, c *proxy.Client) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		st := call(t, c, "status", nil).(map[string]any)
		if st["server"].(map[string]any)["handshaking"] == int64(0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("connections stuck in the handshake")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitNoWaiters waits until no object has a waiter.
func waitNoWaiters(t *testing.T, d *daemon) {
	t.Helper()
	c := d.dial(t)
	deadline := time.Now().Add(bound)
	for {
		st := call(t, c, "status", nil).(map[string]any)
		w := int64(0)
		for _, o := range st["objects"].([]any) {
			w += o.(map[string]any)["waiters"].(int64)
		}
		if w == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters left by vanished clients", w)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
