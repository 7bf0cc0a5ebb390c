package server

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/manager"
)

// TestParkAfterDrainIsRefused: once drainParked has begun, a request that
// would park is answered shutting_down instead, so that the parked-request
// WaitGroup never sees an Add racing with its Wait.
func TestParkAfterDrainIsRefused(t *testing.T) {
	srv, err := New(Config{Key: []byte("k"), Logger: zerolog.Nop()}, manager.New(manager.DefaultConfig()))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.cancel()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := srv.newConn(a)
	defer c.close()
	sess, err := srv.mgr.OpenSession(nil, 1, "t")
	if err != nil {
		t.Fatal(err)
	}
	c.sess = sess

	release := make(chan struct{})
	wait := func(ctx context.Context) (any, manager.Grant, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, manager.Grant{}, nil
	}
	if err := c.park(0, wait); err != errParked {
		t.Fatalf("first park: %v", err)
	}
	drained := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.drainParked(ctx)
		close(drained)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.pmu.Lock()
		d := c.draining
		c.pmu.Unlock()
		if d {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("drainParked did not start")
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.park(0, wait); !errors.Is(err, manager.ErrShutdown) {
		t.Fatalf("park during drain: %v, want ErrShutdown", err)
	}
	close(release)
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		t.Fatal("drainParked did not return")
	}
}
