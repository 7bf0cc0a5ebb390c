//go:build synctest

package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/manager"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/statemem"
	"github.com/syncmgr/syncmgr/wire"
)

// The tests that kill a client at a labelled step of a ring op arm
// statemem's kill hook, which only a test build with the synctest tag has
// (go test -tags synctest, as make test-go runs them).

func init() { stepChild = ringStepChild }

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
	if op[0] == 'j' {
		return joinableStepChild(ctx, c, name, op, step, item)
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

func joinableStepChild(ctx context.Context, c *proxy.Client, name, op string, step int, item int64) int {
	q, err := c.JoinableQueue(ctx, name, 0)
	if err != nil || !q.FastPath() {
		fmt.Fprintln(os.Stderr, "joinable queue not on the ring:", err)
		return 2
	}
	if v, err := q.Get(ctx); err != nil || v != int64(0) {
		fmt.Fprintln(os.Stderr, "first get:", v, err)
		return 2
	}
	statemem.SetRingKillStep(step)
	switch op {
	case "jput":
		err = q.Put(ctx, item)
	case "jget":
		_, err = q.Get(ctx)
	default:
		err = q.TaskDone(ctx)
	}
	fmt.Fprintf(os.Stderr, "step %d not reached: %v\n", step, err)
	return 3
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

// ringOffJournal is the journal op word's offset in a ring's header
// (statemem.Ring's layout): 0 when no JoinableQueue op is in flight.
const ringOffJournal = 48

// A JoinableQueue consumer SIGKILLed at a labelled step of put, get or
// task_done on the ring (as the Python extension's kill loop does): what it
// got and had not marked done is marked done when its session ends (the
// daemon finishes the op from its journal when the kill came between its
// commit and its debt), so Join neither hangs nor returns early, no item
// is delivered twice, one TaskDone too many is a value error, and the
// queue goes on.
func TestJoinableQueueRingConsumerKilledAtEachStep(t *testing.T) {
	rs := serveRing(t)
	// 18 child processes: more than bctx's bound on a loaded machine.
	ctx, cancelAll := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelAll()
	a := dialC(t, rs.path, proxy.WithFastPath())
	jq, err := a.JoinableQueue(ctx, "jsteps", 0)
	if err != nil || !jq.FastPath() {
		t.Fatalf("joinable queue not on the ring: %v", err)
	}
	r := rs.ringOf(t, manager.KindJoinableQueue, "jsteps")
	word := ringWords(t, r)
	cases := []struct {
		op   string
		step int
	}{
		{"jput", 1}, {"jput", 2}, {"jput", 3},
		{"jget", 11}, {"jget", 12}, {"jget", 13},
		{"jdone", 31}, {"jdone", 32}, {"jdone", 33},
	}
	for round := 0; round < 2; round++ {
		for _, tc := range cases {
			for _, x := range []int64{0, 1} {
				if err := jq.Put(ctx, x); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("PROXY_RING_STEP=%s jsteps %s %d 2", rs.path, tc.op, tc.step))
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err == nil {
				t.Fatalf("%s step %d: the child exited 0", tc.op, tc.step)
			}
			ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("%s step %d: the child was not killed there (%v)", tc.op, tc.step, cmd.ProcessState)
			}
			var want []int64 // still queued and unfinished; item 0 is marked done (or done at 33)
			switch tc.step {
			case 13: // the second get committed: both items went with the child, both marked done
			case 3:
				want = []int64{1, 2}
			default:
				want = []int64{1}
			}
			for _, x := range want {
				gctx, cancel := context.WithTimeout(ctx, bound)
				v, err := jq.Get(gctx)
				cancel()
				if err != nil || v != x {
					t.Fatalf("%s step %d round %d: got %v %v, want %d", tc.op, tc.step, round, v, err, x)
				}
				jctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
				err = jq.Join(jctx)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%s step %d: join with item %d unfinished: %v", tc.op, tc.step, x, err)
				}
				if err := jq.TaskDone(ctx); err != nil {
					t.Fatal(err)
				}
			}
			jctx, cancel := context.WithTimeout(ctx, bound)
			err := jq.Join(jctx)
			cancel()
			if err != nil {
				t.Fatalf("%s step %d: join hangs: %v", tc.op, tc.step, err)
			}
			if n, err := jq.Len(ctx); err != nil || n != 0 {
				t.Fatalf("%s step %d: Len %d %v", tc.op, tc.step, n, err)
			}
			if err := jq.TaskDone(ctx); !errors.Is(err, &wire.Error{Code: wire.CodeValueError}) {
				t.Fatalf("%s step %d: one task_done too many: %v", tc.op, tc.step, err)
			}
			// (The daemon's sweeper may hold a free latch for a moment.)
			waitFor(t, fmt.Sprintf("%s step %d: the journal and latch to be clear", tc.op, tc.step), func() bool {
				return atomic.LoadUint64(word(ringOffJournal)) == 0 && atomic.LoadUint64(word(ringOffLatch)) == 0
			})
			if n := r.Waiting(); n != 0 {
				t.Fatalf("%s step %d: %d sleepers counted", tc.op, tc.step, n)
			}
		}
	}
}
