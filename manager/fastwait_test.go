package manager

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/statemem"
)

// A fast-path waiter is listed from its waiter-table entry (and counted in its
// object's waiters); when its session ends, its record is cleared, its heir
// reservation dropped and the object's sleepers woken, and a bogus record
// offset is ignored.
func TestFastWaitersListedAndClearedAtSessionEnd(t *testing.T) {
	m, seg := fastManager(t)
	a := newSession(t, m)
	b, err := m.OpenSession(nil, 0, "waiter")
	if err != nil {
		t.Fatal(err)
	}
	if !m.AttachFastPath(b) || !m.AttachFastPath(a) {
		t.Fatal("attach refused")
	}
	l := create[*Lock](t, m, a, KindLock, "wl", Params{})
	r := fastRef(t, m, l)
	w, aux := seg.State(r.Off), seg.Aux(r.Off)
	if statemem.LockAcquire(w, aux, uint32(a.Slot()), 1, 0) != statemem.OK {
		t.Fatal("take")
	}
	// A live thread of b's process waiting (here: a goroutine with b's slot).
	done := make(chan statemem.Result, 1)
	go func() {
		wt := seg.NewWait(uint32(b.Slot()))
		res := statemem.LockAcquireWait(w, aux, uint32(b.Slot()), 2, 30*time.Second, wt)
		wt.Done(w, res)
		done <- res
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(m.FastWaiting()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("status never listed the fast-path waiter")
		}
		time.Sleep(time.Millisecond)
	}
	fw := m.FastWaiting()
	if len(fw) != 1 || fw[0].Session != b.ID || fw[0].Name != "wl" || fw[0].Kind != KindLock || fw[0].Op != "acquire" {
		t.Fatalf("listed %+v", fw)
	}
	objs, _ := m.Snapshot(0)
	for _, o := range objs {
		if o.Name == "wl" && o.Waiters != 1 {
			t.Fatalf("object waiters %d, want 1", o.Waiters)
		}
	}
	// An entry is data: an offset the daemon does not know is skipped, and
	// so is a slot no live session holds.
	tbl := seg.WaitTable()
	atomic.StoreUint32(&tbl[len(tbl)-1].Off, 12345)
	atomic.StoreUint32(&tbl[len(tbl)-1].Slot, uint32(a.Slot()))
	atomic.StoreUint32(&tbl[len(tbl)-2].Off, r.Off)
	atomic.StoreUint32(&tbl[len(tbl)-2].Slot, 4242)
	if fw := m.FastWaiting(); len(fw) != 1 {
		t.Fatalf("bogus entry listed: %+v", fw)
	}
	atomic.StoreUint32(&tbl[len(tbl)-1].Slot, 0)
	atomic.StoreUint32(&tbl[len(tbl)-2].Slot, 0)
	// c's slot is the heir; c's session ends (its process died): the
	// reservation goes.
	c, err := m.OpenSession(nil, 0, "heir")
	if err != nil || !m.AttachFastPath(c) {
		t.Fatal("session c", err)
	}
	atomic.StoreUint32(seg.Heir(r.Off), uint32(c.Slot()))
	m.CloseSession(c)
	if atomic.LoadUint32(seg.Heir(r.Off)) == uint32(c.Slot()) { // (b's waiter, woken, may be the heir now)
		t.Fatal("dead session's heir reservation kept")
	}
	// b's session ends: its entries are freed and the sleepers woken.
	m.CloseSession(b)
	if len(seg.Waiting(uint32(b.Slot()))) != 0 {
		t.Fatal("dead session's record kept")
	}
	// (The goroutine is no real dead process: it goes on waiting, and gets
	// the lock once a releases it, as a sleeper woken for nothing would.)
	if statemem.LockRelease(w, aux) != statemem.OK {
		t.Fatal("release")
	}
	select {
	case res := <-done:
		if res != statemem.OK {
			t.Fatalf("waiter: %v", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was never woken")
	}
	statemem.LockRelease(w, aux)
	m.CloseSession(a)
}
