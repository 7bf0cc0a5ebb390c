package manager

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/internal/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }

// bound is the longest any single wait in these tests may take.
const bound = 5 * time.Second

func newManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	m := New(cfg)
	t.Cleanup(m.Close) // fails whatever a failed test left waiting
	return m
}

func newSession(t *testing.T, m *Manager) *Session {
	t.Helper()
	s, err := m.OpenSession(nil, 1, "test")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

func create[T Object](t *testing.T, m *Manager, s *Session, kind Kind, name string, p Params) T {
	t.Helper()
	obj, _, err := m.Create(s, kind, name, p)
	if err != nil {
		t.Fatalf("create %s %q: %v", kind, name, err)
	}
	o, ok := obj.(T)
	if !ok {
		t.Fatalf("create %s: got %T", kind, obj)
	}
	return o
}

// result is what an asynchronous call returned.
type result[T any] struct {
	v   T
	err error
}

// async runs fn in a goroutine and returns a channel with its result.
func async[T any](fn func() (T, error)) <-chan result[T] {
	ch := make(chan result[T], 1)
	go func() {
		v, err := fn()
		ch <- result[T]{v, err}
	}()
	return ch
}

// recv waits for a result, failing the test after bound.
func recv[T any](t *testing.T, ch <-chan result[T]) result[T] {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(bound):
		t.Fatal("timed out waiting for a result")
		panic("unreachable")
	}
}

// pending checks that nothing arrives on ch within d.
func pending[T any](t *testing.T, ch <-chan result[T], d time.Duration) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("returned early: %v, %v", r.v, r.err)
	case <-time.After(d):
	}
}

// waitWaiters waits until obj reports n waiters.
func waitWaiters(t *testing.T, obj Object, n int) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for i := 0; ; i++ {
		_, w := obj.Describe()
		if w == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d waiters, want %d", obj.Name(), w, n)
		}
		if i < 100 {
			runtime.Gosched() // cheap for the many-iteration race tests
		} else {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

func isErr(err, target error) bool { return errors.Is(err, target) }
