package proxy_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
)

// Child processes: the test binary re-run with PROXY_RING_CHILD set to
// "<socket> <queue>": a fast-path client that moves items from the queue's
// head to its tail for ever, until it is killed.
// With PROXY_RING_STEP set to "<socket> <queue> <op> <step> <item>" it is
// (in a test build with the synctest tag: queue_kill_step_test.go, which
// sets stepChild) a fast-path client that arms statemem's kill hook at
// step and does one
// op (put item, or get), exiting 3 if it was not killed. The ops jput,
// jget and jdone work on a JoinableQueue: the child first gets one item
// (which it then owes), then arms the hook and puts item, gets, or marks
// a task done.
func TestMain(m *testing.M) {
	if spec := os.Getenv("PROXY_RING_CHILD"); spec != "" {
		os.Exit(ringChild(spec))
	}
	if spec := os.Getenv("PROXY_RING_STEP"); spec != "" && stepChild != nil {
		os.Exit(stepChild(spec))
	}
	os.Exit(m.Run())
}

// stepChild runs a PROXY_RING_STEP child; nil in a build without the kill
// hook.
var stepChild func(spec string) int

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
