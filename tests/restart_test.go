package tests

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

// TestStaleHolderAfterRestart: A held L; the daemon was SIGKILLed and
// restarted on the same socket; B acquired L. A's release, naming the run
// under which it acquired, is refused with server_restarted, and B still
// holds L. (It once succeeded and freed B's lock.)
func TestStaleHolderAfterRestart(t *testing.T) {
	d := startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	a := d.dial(t)
	oldRun := a.Info().RunID
	if len(oldRun) != 32 {
		t.Fatalf("run id %q: want 32 hex digits", oldRun)
	}
	la, err := a.Lock(ctx, "L")
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	d.signal(syscall.SIGKILL)
	d.start()

	b := d.dial(t)
	if b.Info().RunID == oldRun || b.Info().RunID == "" {
		t.Fatalf("run id after restart %q, before %q: want a new one", b.Info().RunID, oldRun)
	}
	lb, err := b.Lock(ctx, "L")
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	// The Go client's handle is bound to its dead connection: an error.
	if err := la.Release(ctx); err == nil {
		t.Fatal("A's release on its dead connection succeeded")
	}
	// A client that reconnects (as the Python client does) and releases,
	// naming the old run, gets server_restarted.
	a2 := d.dial(t)
	err = callErr(a2, wire.OpRelease, obj(wire.KindLock, "L", wire.ArgRun, oldRun))
	if !errors.Is(err, proxy.ErrServerRestarted) {
		t.Fatalf("release naming the old run: %v, want server_restarted", err)
	}
	lc, err := a2.Lock(ctx, "L")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := lc.TryAcquire(ctx); err != nil || ok {
		t.Fatalf("L after the stale release: acquired %v, %v; want still held by B", ok, err)
	}
	// B, of this run, releases normally.
	if err := lb.Release(ctx); err != nil {
		t.Fatalf("B's release: %v", err)
	}
}
