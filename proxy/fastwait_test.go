package proxy_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/statemem"
)

// The Go client's fast-path waits with other processes: a Go waiter is
// listed by status from its waiter record, a Go release or set wakes a
// Python waiter and the reverse, and a Go waiter killed in its wait takes
// nothing (no unit, no lock, no heir reservation).

// waitersOn counts status's waiting entries for the object called name.
func waitersOn(t *testing.T, c *proxy.Client, name string) int {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ws, _ := st["waiting"].([]any)
	for _, w := range ws {
		if m, _ := w.(map[string]any); m != nil && m["name"] == name {
			n++
		}
	}
	return n
}

// awaitWaiters polls status until it lists want waiters on name.
func awaitWaiters(t *testing.T, c *proxy.Client, name string, want int) {
	t.Helper()
	deadline := time.Now().Add(2 * bound)
	for {
		n := waitersOn(t, c, name)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status lists %d waiters on %s, want %d", n, name, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A Semaphore's Go waiters are listed by status, and each release by the
// Go client wakes one of them, who takes the unit without joining the
// daemon's queue (the daemon bit stays clear).
func TestFastPathGoSemaphoreWaitersListedAndWokenOneByOne(t *testing.T) {
	path, seg := serveFastSeg(t)
	ctx := context.Background()
	a := dialC(t, path, proxy.WithFastPath())
	s, err := a.Semaphore(ctx, "gw-sem", 0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	got := make(chan error, n)
	var waiters []*proxy.Mutex
	for range n {
		c := dialC(t, path, proxy.WithFastPath())
		if ok, why := c.FastPath(); !ok {
			t.Skip("no fast path:", why)
		}
		ws, err := c.Semaphore(ctx, "gw-sem", 0)
		if err != nil {
			t.Fatal(err)
		}
		waiters = append(waiters, ws)
		go func() { got <- ws.Acquire(ctx) }()
	}
	awaitWaiters(t, a, "gw-sem", n)
	off := semOff(t, seg)
	for i := range n {
		if err := s.Release(ctx); err != nil { // a release with no unit of a's own: the daemon's
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * bound):
			t.Fatalf("release %d woke nobody", i+1)
		}
		if x := atomic.LoadUint64(seg.State(off)); x&statemem.BitDaemon != 0 {
			t.Fatalf("word %#x: a waiter went to the daemon's queue", x)
		}
		awaitWaiters(t, a, "gw-sem", n-1-i)
	}
	for _, ws := range waiters {
		if err := ws.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v := statemem.SemValue(seg.State(off)); v != n {
		t.Fatalf("value %d after the releases, want %d", v, n)
	}
}

// semOff finds the one Semaphore in seg.
func semOff(t *testing.T, seg *statemem.Segment) uint32 {
	t.Helper()
	for off := uint32(statemem.SlotSize); seg.Valid(off); off += statemem.SlotSize {
		if k := uint8(*seg.Tag(off)); k == statemem.KindSemaphore || k == statemem.KindBoundedSemaphore {
			return off
		}
	}
	t.Fatal("no Semaphore in the segment")
	return 0
}

// --- a Go waiter in a process of its own, killed in its wait -------------

const helperEnv = "SYNCMGR_TEST_GO_WAITER" // "path kind name" for the helper process

// TestHelperGoWaiter is not a test: it is the process the kill tests start
// (this test binary again) to wait on an object through the fast path
// until it is killed.
func TestHelperGoWaiter(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("a helper process for the kill tests")
	}
	f := strings.Fields(spec)
	ctx := context.Background()
	c, err := proxy.Dial(ctx, f[0], clientKey, proxy.WithFastPath())
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(3)
	}
	if ok, why := c.FastPath(); !ok {
		fmt.Println("no fast path:", why)
		os.Exit(4)
	}
	var m *proxy.Mutex
	switch f[1] {
	case "lock":
		m, err = c.Lock(ctx, f[2])
	default:
		m, err = c.Semaphore(ctx, f[2], 0)
	}
	if err != nil {
		fmt.Println("handle:", err)
		os.Exit(5)
	}
	fmt.Println("waiting")
	err = m.Acquire(ctx)
	fmt.Println("acquired (the test kills this process before):", err)
	os.Exit(6)
}

// startGoWaiter starts a helper process that waits on the object.
func startGoWaiter(t *testing.T, path, kind, name string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperGoWaiter$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+path+" "+kind+" "+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "waiting" {
		t.Fatalf("helper: %q", line)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return cmd
}

// A Go waiter killed while it sleeps in its wait, and killed after it made
// its slot the heir (it has waited past 1 ms), takes nothing: status drops
// it, its heir reservation goes, and the lock or unit released afterwards
// is anyone's.
func TestFastPathKilledGoWaiterTakesNothing(t *testing.T) {
	for _, kind := range []string{"lock", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			path, seg := serveFastSeg(t)
			ctx := context.Background()
			a := dialC(t, path, proxy.WithFastPath())
			if ok, why := a.FastPath(); !ok {
				t.Skip("no fast path:", why)
			}
			name := "gk-" + kind
			var m *proxy.Mutex
			var err error
			if kind == "lock" {
				m, err = a.Lock(ctx, name)
				if err == nil {
					err = m.Acquire(ctx)
				}
			} else {
				m, err = a.Semaphore(ctx, name, 0)
			}
			if err != nil {
				t.Fatal(err)
			}
			cmd := startGoWaiter(t, path, kind, name)
			awaitWaiters(t, a, name, 1)
			off := findOff(t, seg, kind)
			// The helper sleeps in 20 ms slices: after one it makes its slot
			// the heir (it has starved past 1 ms).
			deadline := time.Now().Add(2 * bound)
			for atomic.LoadUint32(seg.Heir(off)) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the starving Go waiter never became the heir")
				}
				time.Sleep(2 * time.Millisecond)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			awaitWaiters(t, a, name, 0)
			deadline = time.Now().Add(2 * bound)
			for atomic.LoadUint32(seg.Heir(off)) != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the killed waiter's heir reservation was kept")
				}
				time.Sleep(2 * time.Millisecond)
			}
			if err := m.Release(ctx); err != nil {
				t.Fatal(err)
			}
			b := dialC(t, path, proxy.WithFastPath())
			var bm *proxy.Mutex
			if kind == "lock" {
				bm, err = b.Lock(ctx, name)
			} else {
				bm, err = b.Semaphore(ctx, name, 0)
			}
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := bm.TryAcquire(ctx); err != nil || !ok {
				t.Fatalf("after the killed waiter: try-acquire %v %v (it took the %s)", ok, err, kind)
			}
			if kind == "semaphore" && casUnits(seg) != 1 {
				t.Fatalf("CAS units %d, want 1 (the new taker's)", casUnits(seg))
			}
		})
	}
}

func findOff(t *testing.T, seg *statemem.Segment, kind string) uint32 {
	t.Helper()
	if kind != "lock" {
		return semOff(t, seg)
	}
	for off := uint32(statemem.SlotSize); seg.Valid(off); off += statemem.SlotSize {
		if uint8(*seg.Tag(off)) == statemem.KindLock {
			return off
		}
	}
	t.Fatal("no Lock in the segment")
	return 0
}

// --- Go and Python wake each other -----------------------------------------

// pythonFast returns an interpreter that imports syncmgr with its C
// extension ($SYNCMGR_TEST_PYTHON, else the repository's .venv), or skips.
func pythonFast(t *testing.T) string {
	t.Helper()
	py := os.Getenv("SYNCMGR_TEST_PYTHON")
	if py == "" {
		py, _ = filepath.Abs(filepath.Join("..", ".venv", "bin", "python"))
	}
	if err := exec.Command(py, "-c", "import syncmgr._fastpath").Run(); err != nil {
		t.Skipf("no Python with syncmgr's C extension at %s (set SYNCMGR_TEST_PYTHON): %v", py, err)
	}
	return py
}

// pyScript: a Python process of the syncmgr client that waits on (or holds)
// a Lock, Semaphore or Event of the test's daemon through the fast path,
// reporting each step on stdout and taking its cues from stdin.
const pyScript = `
import os, sys
import syncmgr
from syncmgr import _fast
m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
kind, name, role = sys.argv[1:4]
o = {"lock": lambda: m.Lock(name=name), "semaphore": lambda: m.Semaphore(0, name=name),
     "event": lambda: m.Event(name=name)}[kind]()
if not _fast.active(o):
    print("slow", _fast.reasons, flush=True)
    sys.exit(2)
if role == "wait":
    print("waiting", flush=True)
    ok = o.wait(30) if kind == "event" else o.acquire(timeout=30)
    print("woken" if ok else "timeout", flush=True)
    if ok and kind != "event":
        o.release()
else:  # hold: take it (by CAS), wait for the cue, let go (by CAS)
    if kind != "event":
        o.acquire()
    print("holding", flush=True)
    sys.stdin.readline()
    o.set() if kind == "event" else o.release()
    print("released", flush=True)
`

type pyProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startPython(t *testing.T, py, path, kind, name, role string) *pyProc {
	t.Helper()
	cmd := exec.Command(py, "-c", pyScript, kind, name, role)
	cmd.Env = append(os.Environ(), "SYNCMGR_ADDRESS="+path, "SYNCMGR_AUTHKEY="+hex.EncodeToString(clientKey))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &pyProc{cmd: cmd, in: in, out: bufio.NewReader(out)}
}

// expect reads the Python process's next line within bound.
func (p *pyProc) expect(t *testing.T, want string) {
	t.Helper()
	got := make(chan string, 1)
	go func() { line, _ := p.out.ReadString('\n'); got <- strings.TrimSpace(line) }()
	select {
	case line := <-got:
		if line != want {
			t.Fatalf("python said %q, want %q", line, want)
		}
	case <-time.After(4 * bound):
		t.Fatalf("python said nothing, want %q", want)
	}
}

// A release (or set) by the Go client wakes a Python waiter asleep on the
// futex, and a Python release (or set) wakes a Go waiter: both sides keep
// the same wake-up rules, so neither strands the other.
func TestFastPathGoAndPythonWakeEachOther(t *testing.T) {
	py := pythonFast(t)
	for _, kind := range []string{"lock", "semaphore", "event"} {
		t.Run(kind, func(t *testing.T) {
			path := serveFast(t)
			ctx := context.Background()
			a := dialC(t, path, proxy.WithFastPath())
			if ok, why := a.FastPath(); !ok {
				t.Skip("no fast path:", why)
			}
			name := "gp-" + kind
			var m *proxy.Mutex
			var ev *proxy.Event
			var err error
			switch kind {
			case "lock":
				m, err = a.Lock(ctx, name)
			case "semaphore":
				m, err = a.Semaphore(ctx, name, 0)
			default:
				ev, err = a.Event(ctx, name)
			}
			if err != nil {
				t.Fatal(err)
			}

			// Go wakes Python.
			if kind == "lock" {
				must(t, m.Acquire(ctx))
			}
			p := startPython(t, py, path, kind, name, "wait")
			p.expect(t, "waiting")
			awaitWaiters(t, a, name, 1) // asleep on the futex, in its waiter record
			if ev != nil {
				must(t, ev.Set(ctx))
			} else {
				must(t, m.Release(ctx))
			}
			p.expect(t, "woken")
			if err := p.cmd.Wait(); err != nil {
				t.Fatal("python waiter:", err)
			}

			// Python wakes Go.
			if ev != nil {
				must(t, ev.Clear(ctx))
			} // (a Semaphore's one unit is free again: the Python waiter gave it back)
			h := startPython(t, py, path, kind, name, "hold")
			h.expect(t, "holding")
			got := make(chan error, 1)
			go func() {
				if ev != nil {
					ok, err := ev.WaitTimeout(ctx, 30*time.Second)
					if err == nil && !ok {
						err = fmt.Errorf("event wait timed out")
					}
					got <- err
					return
				}
				got <- m.Acquire(ctx)
			}()
			awaitWaiters(t, a, name, 1)
			if _, err := io.WriteString(h.in, "go\n"); err != nil {
				t.Fatal(err)
			}
			h.expect(t, "released")
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(4 * bound):
				t.Fatalf("the Python side's release left the Go waiter asleep")
			}
			if err := h.cmd.Wait(); err != nil {
				t.Fatal("python holder:", err)
			}
		})
	}
}
