package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/server"
	"github.com/syncmgr/syncmgr/wire"
)

const bound = 5 * time.Second

var clientKey = []byte("client-test-key")

// serve starts a server and returns its socket path and the server.
func serve(t *testing.T, cfg server.Config) (string, *server.Server) {
	t.Helper()
	return serveWith(t, cfg, manager.DefaultConfig())
}

// serveWith is serve with the manager's configuration mcfg.
func serveWith(t *testing.T, cfg server.Config, mcfg manager.Config) (string, *server.Server) {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "smc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.Key, cfg.Logger = clientKey, zerolog.Nop()
	srv, err := server.New(cfg, manager.New(mcfg))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "s")
	ln, err := server.ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return path, srv
}

func dialC(t *testing.T, path string, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := proxy.Dial(ctx, path, clientKey, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func bctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestClientHandles(t *testing.T) {
	path, _ := serve(t, server.Config{})
	a, b := dialC(t, path), dialC(t, path)
	ctx := bctx(t)

	la, err := a.Lock(ctx, "L")
	must(t, err)
	lb, _ := b.Lock(ctx, "L")
	must(t, la.Acquire(ctx))
	if ok, err := lb.TryAcquire(ctx); ok || err != nil {
		t.Fatalf("TryAcquire of a held lock: %v %v", ok, err)
	}
	if ok, err := lb.AcquireTimeout(ctx, 20*time.Millisecond); ok || err != nil {
		t.Fatalf("AcquireTimeout: %v %v", ok, err)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	if err := lb.Acquire(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past a deadline: %v", err)
	}
	cancel()
	must(t, la.Release(ctx))
	if err := la.Release(ctx); !errors.Is(err, proxy.ErrNotOwner) {
		t.Fatalf("double release: %v", err)
	}
	if ok, _ := lb.TryAcquire(ctx); !ok {
		t.Fatal("the timed-out Acquire left the lock taken")
	}
	must(t, lb.Release(ctx))

	r, _ := a.RLock(ctx, "R")
	r1, r2 := r.WithOwner(1), r.WithOwner(2)
	must(t, r1.Acquire(ctx))
	must(t, r1.Acquire(ctx))
	if ok, _ := r2.TryAcquire(ctx); ok {
		t.Fatal("another owner nested")
	}
	if err := r2.Release(ctx); !errors.Is(err, proxy.ErrNotOwner) {
		t.Fatalf("release by another owner: %v", err)
	}
	must(t, r1.Release(ctx))
	must(t, r1.Release(ctx))

	bs, _ := a.BoundedSemaphore(ctx, "B", 1)
	var we *wire.Error
	if err := bs.Release(ctx); !errors.As(err, &we) || we.Code != wire.CodeValueError {
		t.Fatalf("bounded over-release: %v", err)
	}
	s, _ := a.Semaphore(ctx, "S", 2)
	must(t, s.Acquire(ctx))
	must(t, s.Acquire(ctx))
	if ok, _ := s.TryAcquire(ctx); ok {
		t.Fatal("third unit of two")
	}

	ea, _ := a.Event(ctx, "E")
	eb, _ := b.Event(ctx, "E")
	if ok, err := eb.WaitTimeout(ctx, 10*time.Millisecond); ok || err != nil {
		t.Fatalf("WaitTimeout: %v %v", ok, err)
	}
	done := make(chan error, 1)
	go func() { done <- eb.Wait(ctx) }()
	time.Sleep(10 * time.Millisecond)
	must(t, ea.Set(ctx))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if set, _ := eb.IsSet(ctx); !set {
		t.Fatal("not set")
	}
	must(t, ea.Clear(ctx))

	v, _ := a.Value(ctx, "V", "h", 32767)
	if got, err := v.Add(ctx, 1); got != int64(-32768) || err != nil {
		t.Fatalf("Add wraps: %v %v", got, err)
	}
	if ok, _ := v.CompareAndSet(ctx, -32768, 5); !ok {
		t.Fatal("CompareAndSet")
	}
	must(t, v.Set(ctx, 9))
	if got, _ := v.Get(ctx); got != int64(9) {
		t.Fatalf("Get: %v", got)
	}
	if err := v.Set(ctx, 1<<20); !errors.As(err, &we) || we.Code != wire.CodeValueError {
		t.Fatalf("out of range: %v", err)
	}

	q, _ := a.Queue(ctx, "Q", 1)
	must(t, q.Put(ctx, "x"))
	if err := q.TryPut(ctx, "y"); !errors.Is(err, proxy.ErrFull) {
		t.Fatalf("TryPut on a full queue: %v", err)
	}
	if n, _ := q.Len(ctx); n != 1 {
		t.Fatalf("Len %d", n)
	}
	if got, err := q.TryGet(ctx); got != "x" || err != nil {
		t.Fatalf("TryGet: %q %v", got, err)
	}
	if _, err := q.TryGet(ctx); !errors.Is(err, proxy.ErrEmpty) {
		t.Fatalf("TryGet on an empty queue: %v", err)
	}
	dctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := q.Get(dctx); !errors.Is(err, proxy.ErrEmpty) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get past a deadline: %v", err)
	}
	if _, err := a.Queue(ctx, "L", 0); !errors.Is(err, proxy.ErrKindMismatch) {
		t.Fatalf("kind mismatch: %v", err)
	}
}

// TestClientCancelGivesBack: a Get or Acquire whose context is cancelled as
// the grant arrives never loses the item or keeps the lock.
func TestClientCancelGivesBack(t *testing.T) {
	path, _ := serve(t, server.Config{})
	a, b := dialC(t, path), dialC(t, path)
	ctx := bctx(t)
	qa, _ := a.Queue(ctx, "Q", 0)
	qb, _ := b.Queue(ctx, "Q", 0)
	for i := 0; i < 30; i++ {
		cctx, cancel := context.WithCancel(ctx)
		got := make(chan any, 1)
		go func() {
			item, err := qb.Get(cctx)
			if err != nil {
				item = nil
			}
			got <- item
		}()
		time.Sleep(time.Millisecond)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); cancel() }()
		go func() { defer wg.Done(); must(t, qa.Put(ctx, "item")) }()
		wg.Wait()
		var item any
		select {
		case item = <-got:
		case <-time.After(bound):
			t.Fatal("Get did not return")
		}
		if item != nil {
			continue // delivered to the caller
		}
		// Given back (unget is sent without a reply: allow it to arrive).
		back, err := qa.Get(ctx)
		if err != nil || back != "item" {
			t.Fatalf("iteration %d: item lost: %q %v", i, back, err)
		}
	}
	if n, _ := qa.Len(ctx); n != 0 {
		t.Fatalf("%d items duplicated", n)
	}
}

func TestClientAnonymousClose(t *testing.T) {
	path, _ := serve(t, server.Config{})
	a, b := dialC(t, path), dialC(t, path)
	ctx := bctx(t)
	l, err := a.Lock(ctx, "")
	must(t, err)
	if len(l.Name()) == 0 || l.Kind() != "lock" {
		t.Fatalf("handle %q %q", l.Name(), l.Kind())
	}
	must(t, l.Close())
	deadline := time.Now().Add(bound)
	for {
		_, err := b.Call(ctx, "acquire", map[string]any{"kind": "lock", "name": l.Name(), "block": false}, nil)
		if errors.Is(err, proxy.ErrNoSuchObject) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("anonymous lock not deleted after Close: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	named, _ := a.Lock(ctx, "named")
	must(t, named.Close()) // a no-op
	if _, err := b.Lock(ctx, "named"); err != nil {
		t.Fatal(err)
	}
}

func TestClientCloseAndServerGone(t *testing.T) {
	path, srv := serve(t, server.Config{})
	a, b := dialC(t, path), dialC(t, path)
	ctx := bctx(t)
	la, _ := a.Lock(ctx, "L")
	lb, _ := b.Lock(ctx, "L")
	must(t, la.Acquire(ctx))
	errc := make(chan error, 1)
	go func() { errc <- lb.Acquire(ctx) }()
	time.Sleep(20 * time.Millisecond)
	must(t, a.Close())
	select {
	case <-a.Done():
	default:
		t.Fatal("Done not closed by Close")
	}
	if err := a.Ping(ctx); !errors.Is(err, proxy.ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
	if err := <-errc; err != nil { // a's lock went with its connection
		t.Fatalf("waiter after the holder closed: %v", err)
	}
	go func() { errc <- func() error { _, err := lb.AcquireTimeout(ctx, 10*time.Second); return err }() }()
	time.Sleep(20 * time.Millisecond)
	sctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	must(t, srv.Shutdown(sctx))
	if err := <-errc; !errors.Is(err, proxy.ErrShutdown) {
		t.Fatalf("pending call at shutdown: %v", err)
	}
	select {
	case <-b.Done():
	case <-time.After(bound):
		t.Fatal("client not closed when the server went away")
	}
	if err := b.Ping(ctx); err == nil {
		t.Fatal("call on a dead connection succeeded")
	}
}

func TestClientTooLarge(t *testing.T) {
	path, _ := serve(t, server.Config{MaxFrame: 1024})
	c := dialC(t, path)
	ctx := bctx(t)
	if c.Info().MaxFrame != 1024 {
		t.Fatalf("max frame %d", c.Info().MaxFrame)
	}
	q, _ := c.Queue(ctx, "Q", 0)
	var we *wire.Error
	if err := q.Put(ctx, make([]byte, 2048)); !errors.As(err, &we) || we.Code != wire.CodeTooLarge {
		t.Fatalf("oversize put: %v", err)
	}
	must(t, c.Ping(ctx)) // refused before sending: the connection is fine
}

func TestDialErrors(t *testing.T) {
	path, _ := serve(t, server.Config{})
	ctx := bctx(t)
	if _, err := proxy.Dial(ctx, path, []byte("wrong")); !errors.Is(err, proxy.ErrAuthFailed) {
		t.Fatalf("wrong key: %v", err)
	}
	if _, err := proxy.Dial(ctx, path+".missing", clientKey); err == nil {
		t.Fatal("dial of a missing socket succeeded")
	}
	if _, err := proxy.Dial(ctx, path, nil); err == nil {
		t.Fatal("dial without a key succeeded")
	}
	for in, want := range map[string][2]string{
		"/run/s.sock":         {"unix", "/run/s.sock"},
		"unix:///run/s.sock":  {"unix", "/run/s.sock"},
		"tcp://127.0.0.1:900": {"tcp", "127.0.0.1:900"},
	} {
		if n, a := proxy.ParseAddress(in); n != want[0] || a != want[1] {
			t.Errorf("ParseAddress(%q) = %q %q", in, n, a)
		}
	}
}

// One Client's calls from many goroutines are in flight together on its
// one connection and each gets its own reply: a Get parked on an empty
// queue does not hold up the calls behind it, which are answered before
// it, and the Put that ends it comes from the same Client.
func TestClientPipelinesConcurrentCalls(t *testing.T) {
	path, _ := serve(t, server.Config{})
	c := dialC(t, path)
	q, err := c.Queue(bctx(t), "pipe", 0)
	must(t, err)
	parked := make(chan any, 1)
	go func() {
		got, err := q.Get(bctx(t))
		if err != nil {
			got = err
		}
		parked <- got
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.Value(bctx(t), "", "i", int64(0))
			if err != nil {
				errs <- err
				return
			}
			for i := range 50 {
				want := int64(g*1000 + i)
				if err := v.Set(bctx(t), want); err != nil {
					errs <- err
					return
				}
				got, err := v.Get(bctx(t))
				if err != nil || got != want {
					errs <- fmt.Errorf("goroutine %d: Get = %v, %v; want %d", g, got, err, want)
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
	select {
	case got := <-parked:
		t.Fatalf("the parked Get returned %v before any Put", got)
	default:
	}
	must(t, q.Put(bctx(t), "last"))
	select {
	case got := <-parked:
		if got != "last" {
			t.Fatalf("the parked Get returned %v, want \"last\"", got)
		}
	case <-time.After(bound):
		t.Fatal("the parked Get was not answered")
	}
}
