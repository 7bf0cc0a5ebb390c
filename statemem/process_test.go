package statemem

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Child processes: the test binary re-run with STATEMEM_CHILD set to
// "<op> <size> <offset> <slot> <n>", the segment's descriptor as fd 3.
func TestMain(m *testing.M) {
	if spec := os.Getenv("STATEMEM_CHILD"); spec != "" {
		os.Exit(child(spec))
	}
	os.Exit(m.Run())
}

func child(spec string) int {
	var op string
	var size int64
	var off, slot uint32
	var n int
	if _, err := fmt.Sscan(spec, &op, &size, &off, &slot, &n); err != nil {
		fmt.Fprintln(os.Stderr, "bad child spec:", err)
		return 2
	}
	s, err := OpenFD(3, size)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	w, aux, counter := s.State(off), s.Aux(off), s.Bound(off)
	switch op {
	case "count": // n locked increments of a plain counter
		for i := 0; i < n; i++ {
			if r := LockAcquire(w, aux, slot, int64(i), Forever); r != OK {
				fmt.Fprintln(os.Stderr, "acquire:", r)
				return 1
			}
			*counter++
			if r := LockRelease(w, aux); r != OK {
				fmt.Fprintln(os.Stderr, "release:", r)
				return 1
			}
		}
	case "take": // wait up to n ms for the lock and keep it
		if r := LockAcquire(w, aux, slot, 1, time.Duration(n)*time.Millisecond); r != OK {
			fmt.Fprintln(os.Stderr, "acquire:", r)
			return 1
		}
	}
	return 0
}

func startChild(t *testing.T, s *Segment, op string, off, slot uint32, n int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	dup, err := unix.Dup(s.FD()) // the child's fd 3; the File closes the copy, not s's
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "segment")
	defer f.Close()
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = append(os.Environ(), "STATEMEM_CHILD="+op+" "+strconv.FormatInt(s.Size(), 10)+" "+
		strconv.Itoa(int(off))+" "+strconv.Itoa(int(slot))+" "+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func waitExit(t *testing.T, cmd *exec.Cmd, within time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		t.Fatalf("child %d still running after %v", cmd.Process.Pid, within)
		return nil
	}
}

func TestCrossProcessMutualExclusion(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindLock, 0, 0)
	const rounds = 20000
	a := startChild(t, s, "count", r.Off, 1, rounds)
	b := startChild(t, s, "count", r.Off, 2, rounds)
	w, aux, counter := s.State(r.Off), s.Aux(r.Off), s.Bound(r.Off)
	for i := 0; i < rounds; i++ {
		LockAcquire(w, aux, 3, 0, Forever)
		*counter++
		LockRelease(w, aux)
	}
	for _, c := range []*exec.Cmd{a, b} {
		if err := waitExit(t, c, 60*time.Second); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
	if got := atomic.LoadUint64(counter); got != 3*rounds {
		t.Fatalf("counter %d, want %d", got, 3*rounds)
	}
}

// Release wakes every sleeper, so one that is SIGKILLed while asleep (or
// right after being woken) leaves the others able to take the lock.
func TestKilledSleeperDoesNotStrandOthers(t *testing.T) {
	s := newSeg(t, 4)
	r, _ := s.Alloc(KindLock, 0, 0)
	w, aux := s.State(r.Off), s.Aux(r.Off)
	LockAcquire(w, aux, 9, 0, 0)
	doomed := startChild(t, s, "take", r.Off, 1, 20000)
	survivor := startChild(t, s, "take", r.Off, 2, 20000)
	waitFor(t, func() bool { return atomic.LoadUint64(w)&BitWaiters != 0 })
	time.Sleep(50 * time.Millisecond) // let both reach FUTEX_WAIT
	doomed.Process.Signal(syscall.SIGKILL)
	waitExit(t, doomed, 10*time.Second)
	LockRelease(w, aux)
	if err := waitExit(t, survivor, 10*time.Second); err != nil {
		t.Fatalf("survivor: %v", err)
	}
	if owner := atomic.LoadUint64(w) & MaskLow; owner != 2 {
		t.Fatalf("owner %d, want the survivor's slot 2", owner)
	}
}
