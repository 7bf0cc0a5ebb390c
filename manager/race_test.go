package manager

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// These tests cancel waiters at the same moment as a grant (a release or a
// put) and check the invariant the transport relies on: a waiter whose call
// returns success owns what it got (and gives it back), one whose call
// fails got nothing, so nothing is lost or duplicated.

// iterations scales the race tests; each iteration is one race.
func iterations(t *testing.T) int {
	if testing.Short() {
		return 50
	}
	return 400
}

// together runs the functions at (nearly) the same moment and waits for them.
func together(fns ...func()) {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for _, fn := range fns {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			fn()
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
}

func TestRaceLockGrantVersusCancel(t *testing.T) {
	m := newManager(t, DefaultConfig())
	holder, waiter := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	for _, kind := range []Kind{KindLock, KindRLock} {
		t.Run(string(kind), func(t *testing.T) {
			obj, _, _ := m.Create(holder, kind, "race-"+string(kind), Params{})
			l := obj.(interface {
				Object
				Acquire(context.Context, *Session, int64, bool, time.Duration) (bool, error)
				Release(*Session, int64) error
			})
			won := 0
			for i := 0; i < iterations(t); i++ {
				if ok, err := l.Acquire(ctx, holder, 1, false, 0); !ok || err != nil {
					t.Fatalf("iteration %d: the lock is not free: %v", i, err)
				}
				wctx, cancel := context.WithCancel(ctx)
				ch := async(func() (bool, error) { return l.Acquire(wctx, waiter, 2, true, Forever) })
				waitWaiters(t, l, 1)
				together(cancel, func() {
					if err := l.Release(holder, 1); err != nil {
						t.Errorf("release: %v", err)
					}
				})
				r := recv(t, ch)
				switch {
				case r.v && r.err == nil:
					won++
					if waiter.Holds() != 1 {
						t.Fatalf("iteration %d: granted but the session holds %d", i, waiter.Holds())
					}
					if ok, _ := l.Acquire(ctx, holder, 1, false, 0); ok {
						t.Fatalf("iteration %d: the lock is held twice", i)
					}
					if err := l.Release(waiter, 2); err != nil { // give it back
						t.Fatalf("iteration %d: release of a grant: %v", i, err)
					}
				case !r.v && r.err == context.Canceled:
					if waiter.Holds() != 0 {
						t.Fatalf("iteration %d: cancelled waiter holds %d", i, waiter.Holds())
					}
				default:
					t.Fatalf("iteration %d: got %v %v", i, r.v, r.err)
				}
				if st, w := l.Describe(); st != "unlocked" || w != 0 {
					t.Fatalf("iteration %d: %s, %d waiters", i, st, w)
				}
			}
			t.Logf("%d of %d races won by the grant", won, iterations(t))
		})
	}
}

func TestRaceSemaphoreGrantVersusCancel(t *testing.T) {
	m := newManager(t, DefaultConfig())
	releaser := newSession(t, m)
	ctx := testCtx(t)
	const waiters, units = 6, 3
	sessions := make([]*Session, waiters)
	for i := range sessions {
		sessions[i] = newSession(t, m)
	}
	for _, kind := range []Kind{KindSemaphore, KindBoundedSemaphore} {
		t.Run(string(kind), func(t *testing.T) {
			sem := create[*Semaphore](t, m, releaser, kind, "race-"+string(kind), Params{Value: units})
			for i := 0; i < iterations(t)/4; i++ {
				for j := 0; j < units; j++ {
					sem.Acquire(ctx, releaser, 0, false, 0)
				}
				cancels := make([]context.CancelFunc, waiters)
				chs := make([]<-chan result[bool], waiters)
				for j, s := range sessions {
					wctx, cancel := context.WithCancel(ctx)
					cancels[j] = cancel
					chs[j] = async(func() (bool, error) { return sem.Acquire(wctx, s, 0, true, Forever) })
				}
				waitWaiters(t, sem, waiters)
				var fns []func()
				for _, j := range rand.Perm(waiters)[:waiters/2] {
					fns = append(fns, cancels[j])
				}
				for j := 0; j < units; j++ {
					fns = append(fns, func() { sem.Release(releaser, 0) })
				}
				together(fns...)
				for _, c := range cancels {
					c() // the rest give up now
				}
				// Collect every answer before giving anything back: a unit
				// released now could still go to a waiter whose cancel is
				// under way, which is a legitimate grant.
				var granted []*Session
				for j, ch := range chs {
					r := recv(t, ch)
					if r.v {
						granted = append(granted, sessions[j])
						if sessions[j].Holds() != 1 {
							t.Fatalf("iteration %d: granted waiter holds %d", i, sessions[j].Holds())
						}
					} else if r.err != context.Canceled || sessions[j].Holds() != 0 {
						t.Fatalf("iteration %d: waiter %d: %v, holds %d", i, j, r.err, sessions[j].Holds())
					}
				}
				if len(granted) > units || sem.Value() != int64(units-len(granted)) {
					t.Fatalf("iteration %d: %d units granted of %d, value %d", i, len(granted), units, sem.Value())
				}
				for _, s := range granted {
					sem.Release(s, 0)
				}
				if sem.Value() != units {
					t.Fatalf("iteration %d: value %d after everything was given back, want %d", i, sem.Value(), units)
				}
				waitWaiters(t, sem, 0)
			}
		})
	}
}

func TestRaceQueueGetVersusCancel(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s := newSession(t, m)
	ctx := testCtx(t)
	q := create[*Queue](t, m, s, KindQueue, "race-get", Params{})
	const getters, puts = 5, 3
	next := 0
	for i := 0; i < iterations(t)/4; i++ {
		cancels := make([]context.CancelFunc, getters)
		chs := make([]<-chan result[[]byte], getters)
		for j := range chs {
			wctx, cancel := context.WithCancel(ctx)
			cancels[j] = cancel
			chs[j] = async(func() ([]byte, error) { return q.Get(wctx, true, Forever) })
		}
		waitWaiters(t, q, getters)
		want := map[string]bool{}
		var fns []func()
		for _, j := range rand.Perm(getters)[:getters-1] {
			fns = append(fns, cancels[j])
		}
		for j := 0; j < puts; j++ {
			it := item(next)
			next++
			want[string(it)] = true
			fns = append(fns, func() {
				if err := q.Put(ctx, it, true, Forever); err != nil {
					t.Errorf("put: %v", err)
				}
			})
		}
		together(fns...)
		for _, c := range cancels {
			c()
		}
		got := map[string]int{}
		for _, ch := range chs {
			r := recv(t, ch)
			if r.err == nil {
				got[string(r.v)]++
			} else if r.err != context.Canceled || r.v != nil {
				t.Fatalf("iteration %d: getter: %q %v", i, r.v, r.err)
			}
		}
		for q.Len() > 0 {
			it, _ := q.Get(ctx, false, 0)
			got[string(it)]++
		}
		if len(got) != len(want) {
			t.Fatalf("iteration %d: got %v, want %v", i, got, want)
		}
		for it, n := range got {
			if n != 1 || !want[it] {
				t.Fatalf("iteration %d: item %q seen %d times (want %v)", i, it, n, want)
			}
		}
		waitWaiters(t, q, 0)
	}
}

func TestRaceQueuePutVersusCancel(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s := newSession(t, m)
	ctx := testCtx(t)
	const putters, gets = 4, 3
	for _, maxsize := range []int64{1, 2} {
		t.Run(fmt.Sprint("maxsize=", maxsize), func(t *testing.T) {
			q := create[*Queue](t, m, s, KindQueue, fmt.Sprint("race-put-", maxsize), Params{MaxSize: maxsize})
			next := 0
			for i := 0; i < iterations(t)/4; i++ {
				in := map[string]bool{} // items that went in
				for !q.Full() {
					it := item(next)
					next++
					q.Put(ctx, it, false, 0)
					in[string(it)] = true
				}
				cancels := make([]context.CancelFunc, putters)
				chs := make([]<-chan result[struct{}], putters)
				items := make([]string, putters)
				for j := range chs {
					wctx, cancel := context.WithCancel(ctx)
					cancels[j] = cancel
					it := item(next)
					next++
					items[j] = string(it)
					chs[j] = async(func() (struct{}, error) { return struct{}{}, q.Put(wctx, it, true, Forever) })
				}
				waitWaiters(t, q, putters)
				out := map[string]int{}
				var mu sync.Mutex
				var fns []func()
				for _, j := range rand.Perm(putters)[:putters/2] {
					fns = append(fns, cancels[j])
				}
				for j := 0; j < gets; j++ {
					fns = append(fns, func() {
						it, err := q.Get(ctx, true, Forever)
						if err != nil {
							t.Errorf("get: %v", err)
							return
						}
						mu.Lock()
						out[string(it)]++
						mu.Unlock()
					})
				}
				together(fns...)
				for _, c := range cancels {
					c()
				}
				for j, ch := range chs {
					r := recv(t, ch)
					switch r.err {
					case nil:
						in[items[j]] = true
					case context.Canceled:
					default:
						t.Fatalf("iteration %d: putter: %v", i, r.err)
					}
				}
				for q.Len() > 0 {
					it, _ := q.Get(ctx, false, 0)
					out[string(it)]++
				}
				if len(out) != len(in) {
					t.Fatalf("iteration %d: put %v, got %v", i, in, out)
				}
				for it, n := range out {
					if n != 1 || !in[it] {
						t.Fatalf("iteration %d: item %q seen %d times; put %v", i, it, n, in)
					}
				}
				waitWaiters(t, q, 0)
			}
		})
	}
}

// A party whose wait times out breaks the barrier as it leaves: a party
// arriving just after it left (here, in the very gap between the leaving
// and the breaking that there used to be) finds the barrier broken and
// does not pass alone on the count the leaver left behind.
func TestBarrierPartyThatGaveUpIsNotCounted(t *testing.T) {
	m := newManager(t, DefaultConfig())
	a, b := newSession(t, m), newSession(t, m)
	ctx := testCtx(t)
	br := create[*Barrier](t, m, a, KindBarrier, "gave-up", Params{Parties: 2, Timeout: Forever})
	late := make(chan error, 1)
	testHookGaveUp = func() {
		testHookGaveUp = nil
		_, _, err := br.Wait(ctx, b, 0) // arrives as the first party leaves
		late <- err
	}
	t.Cleanup(func() { testHookGaveUp = nil })
	if _, _, err := br.Wait(ctx, a, 10*time.Millisecond); !errors.Is(err, ErrBroken) {
		t.Fatalf("the party that timed out: %v, want ErrBroken", err)
	}
	select {
	case err := <-late:
		if !errors.Is(err, ErrBroken) {
			t.Fatalf("the party that came as the other left: %v, want ErrBroken (it passed alone)", err)
		}
	case <-time.After(bound):
		t.Fatal("the late party's wait did not return")
	}
	if !br.Broken() {
		t.Fatal("the barrier is not broken after a party timed out")
	}
}
