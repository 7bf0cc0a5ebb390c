package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/statemem"
)

// Child processes: the test binary re-run with PROXY_RING_CHILD set to
// "<socket> <queue>": a fast-path client that moves items from the queue's
// head to its tail for ever, until it is killed.
// With PROXY_RING_STEP set to "<socket> <queue> <op> <step> <item>" it is
// a fast-path client that arms statemem's kill hook at step and does one
// op (put item, or get), exiting 3 if it was not killed.
func TestMain(m *testing.M) {
	if spec := os.Getenv("PROXY_RING_CHILD"); spec != "" {
		os.Exit(ringChild(spec))
	}
	if spec := os.Getenv("PROXY_RING_STEP"); spec != "" {
		os.Exit(ringStepChild(spec))
	}
	os.Exit(m.Run())
}

func ringStepChild(spec string) int {
	var path, name, op string
	var step int
	var item int64
	if _, err := fmt.Sscan(spec, &path, &name, &op, &step, &item); err != nil {
		fmt.Fprintln(os.Stderr, "bad child spec:", err)
		return 2
	}
	ctx := context.Background()
	c, err := proxy.Dial(ctx, path, clientKey, proxy.WithFastPath())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	q, err := c.Queue(ctx, name, 0)
	if err != nil || !q.FastPath() {
		fmt.Fprintln(os.Stderr, "queue not on the ring:", err)
		return 2
	}
	statemem.SetRingKillStep(step)
	if op == "put" {
		err = q.Put(ctx, item)
	} else {
		_, err = q.Get(ctx)
	}
	fmt.Fprintf(os.Stderr, "step %d not reached: %v\n", step, err)
	return 3
}

func ringChild(spec string) int {
	var path, name string
	if _, err := fmt.Sscan(spec, &path, &name); err != nil {
		fmt.Fprintln(os.Stderr, "bad child spec:", err)
		return 2
	}
	ctx := context.Background()
	c, err := proxy.Dial(ctx, path, clientKey, proxy.WithFastPath())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	q, err := c.Queue(ctx, name, 0)
	if err != nil || !q.FastPath() {
		fmt.Fprintln(os.Stderr, "queue not on the ring:", err)
		return 2
	}
	os.Stdout.WriteString("ready\n")
	for {
		v, err := q.Get(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := q.Put(ctx, v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
}

// Processes SIGKILLed at random points while they get and put on a ring
// never wedge the queue (another client's get and put go on each time) and
// never duplicate an item; at most the one item a killed process had got
// and not yet put back is lost per kill.
func TestQueueRingKilledClientsNeverWedge(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	q, _ := a.Queue(ctx, "kill", 0)
	const items, kills = 64, 25
	for i := 0; i < items; i++ {
		if err := q.Put(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	for k := 0; k < kills; k++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "PROXY_RING_CHILD="+rs.path+" kill")
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 6)
		if _, err := out.Read(buf); err != nil || string(buf) != "ready\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child %d did not start: %q %v", k, buf, err)
		}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		// The queue goes on: a get and a put by another client.
		gctx, cancel := context.WithTimeout(ctx, bound)
		v, err := q.Get(gctx)
		cancel()
		if err != nil {
			t.Fatalf("kill %d: the queue is wedged: %v", k, err)
		}
		if err := q.Put(ctx, v); err != nil {
			t.Fatalf("kill %d: put: %v", k, err)
		}
	}
	seen := map[int64]bool{}
	for {
		v, err := q.TryGet(ctx)
		if err != nil {
			break
		}
		n := v.(int64)
		if seen[n] {
			t.Fatalf("item %d twice", n)
		}
		seen[n] = true
	}
	if len(seen) < items-kills || len(seen) > items {
		t.Fatalf("%d items left of %d after %d kills", len(seen), items, kills)
	}
	t.Logf("%d of %d items left after %d kills", len(seen), items, kills)
}

// A process SIGKILLed at each labelled step of a ring put or get (as the
// Python extension's kill loops do): a put killed before its commit store
// put nothing and one killed after it put the item; a get killed before
// its commit left the item at the head and one killed after it took it; a
// sleeper killed as it leaves its sleep took nothing. The queue goes on at
// once for everyone else each time.
func TestQueueRingKilledAtEachStep(t *testing.T) {
	rs := serveRing(t)
	ctx := bctx(t)
	a := dialC(t, rs.path, proxy.WithFastPath())
	q, _ := a.Queue(ctx, "steps", 0)
	r := rs.ring(t, "steps")
	cases := []struct {
		op    string
		step  int
		stays bool // the queue holds the item afterwards
	}{
		{"put", 1, false}, {"put", 2, false}, {"put", 3, true},
		{"get", 11, true}, {"get", 12, true}, {"get", 13, false}, {"get", 21, true},
	}
	for round := 0; round < 3; round++ {
		for _, tc := range cases {
			item := int64(100*round + tc.step)
			if tc.op == "get" && tc.step != 21 {
				if err := q.Put(ctx, item); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("PROXY_RING_STEP=%s steps %s %d %d", rs.path, tc.op, tc.step, item))
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if tc.step == 21 { // the child sleeps on the empty ring; a put wakes it
				waitFor(t, "the child to sleep", func() bool { return r.Waiting() == 1 })
				if err := q.Put(ctx, item); err != nil {
					t.Fatal(err)
				}
			}
			_ = cmd.Wait()
			ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("%s step %d: the child was not killed there (%v)", tc.op, tc.step, cmd.ProcessState)
			}
			gctx, cancel := context.WithTimeout(ctx, bound)
			v, err := q.TryGet(gctx)
			cancel()
			switch {
			case tc.stays && (err != nil || v != item):
				t.Fatalf("%s killed at step %d: got %v %v, want item %d still there", tc.op, tc.step, v, err, item)
			case !tc.stays && !errors.Is(err, proxy.ErrEmpty):
				t.Fatalf("%s killed at step %d: got %v %v, want an empty queue", tc.op, tc.step, v, err)
			}
			if err := q.Put(ctx, "live"); err != nil {
				t.Fatalf("%s step %d: put after the kill: %v", tc.op, tc.step, err)
			}
			if v, err := q.TryGet(ctx); err != nil || v != "live" {
				t.Fatalf("%s step %d: get after the kill: %v %v", tc.op, tc.step, v, err)
			}
		}
	}
	if n := r.Waiting(); n != 0 {
		t.Fatalf("%d sleepers counted after the kills", n)
	}
}
