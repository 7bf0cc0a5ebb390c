package server

import (
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/syncmgr/syncmgr/manager"
)

// TestAdmissionAnswerGrace (issue 31): with the budget full of peers that
// have spoken, a newcomer does not drop one until it has owed its answer
// for answerGrace (the newcomer waits), then drops the longest-owing; a
// wrong key is dropped at once; a handshake that ends lets a waiting
// newcomer in without dropping anyone.
func TestAdmissionAnswerGrace(t *testing.T) {
	srv, err := New(Config{Key: []byte("k"), Logger: zerolog.Nop(), MaxUnauthenticated: 2}, manager.New(manager.DefaultConfig()))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.cancel()
	a := srv.adm
	newcomer := func() *conn {
		x, y := net.Pipe() // one source ("pipe"), counted as TCP
		t.Cleanup(func() { x.Close(); y.Close() })
		return srv.newConn(x)
	}
	spoke := func(c *conn, helloAgo time.Duration) { // it sent its ready frame; our hello went out helloAgo
		a.mu.Lock()
		defer a.mu.Unlock()
		e := a.pending[c]
		e.progress.Store(true)
		e.hello.Store(time.Now().Add(-helloAgo).UnixNano())
	}
	admitTimed := func(c *conn) time.Duration {
		start := time.Now()
		a.admit(c)
		return time.Since(start)
	}
	dropped := func(c *conn) bool { return c.ctx.Err() != nil }

	c1, c2 := newcomer(), newcomer()
	a.admit(c1)
	a.admit(c2)
	spoke(c1, 0)
	spoke(c2, 0)
	// Both within their grace: the newcomer waits, then drops the one
	// that has owed its answer longer.
	spoke(c2, 10*time.Millisecond)
	c3 := newcomer()
	if took := admitTimed(c3); took < answerGrace/2 || took > 10*answerGrace {
		t.Fatalf("the newcomer was admitted after %v, want about %v", took, answerGrace)
	}
	if !dropped(c2) || dropped(c1) {
		t.Fatalf("dropped: c1 %v, c2 %v; want c2 (it owed its answer longer)", dropped(c1), dropped(c2))
	}
	spoke(c3, 0)

	// A wrong key goes at once.
	a.mu.Lock()
	a.pending[c3].failed.Store(true)
	a.mu.Unlock()
	c4 := newcomer()
	if took := admitTimed(c4); took > answerGrace/2 {
		t.Fatalf("a wrong key was dropped after %v, want at once", took)
	}
	if !dropped(c3) || dropped(c1) {
		t.Fatalf("dropped: c1 %v, c3 %v; want c3 (wrong key)", dropped(c1), dropped(c3))
	}

	// A handshake that ends makes room: no one is dropped.
	spoke(c1, 0)
	spoke(c4, 0)
	go func() {
		time.Sleep(5 * time.Millisecond)
		a.leave(c1)
	}()
	c5 := newcomer()
	if took := admitTimed(c5); took > answerGrace*9/10 {
		t.Fatalf("the newcomer waited %v for a handshake that ended after 5 ms", took)
	}
	if dropped(c4) || a.pendingCount() != 2 {
		t.Fatalf("c4 dropped %v, %d pending; want c4 kept and 2 pending", dropped(c4), a.pendingCount())
	}

	// A silent peer (no bytes sent, none waiting) goes at once, before one
	// that has spoken however long it has owed its answer.
	c6 := newcomer()
	if took := admitTimed(c6); took > answerGrace/2 {
		t.Fatalf("a silent peer was dropped after %v, want at once", took)
	}
	if !dropped(c5) || dropped(c4) {
		t.Fatalf("dropped: c4 %v, c5 %v; want c5 (silent)", dropped(c4), dropped(c5))
	}
}
