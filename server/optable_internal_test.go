package server

import (
	"strings"
	"testing"

	"github.com/syncmgr/syncmgr/wire"
)

func mustPanic(t *testing.T, what, want string, fn func()) {
	t.Helper()
	defer func() {
		r := recover()
		if r == nil {
			t.Fatalf("%s: no panic", what)
		}
		if msg, _ := r.(string); !strings.Contains(msg, want) {
			t.Fatalf("%s: panic %v, want one mentioning %q", what, r, want)
		}
	}()
	fn()
}

func emptyTable() *opTable {
	return &opTable{server: map[string]*op{}, object: map[string]map[string]*op{}, named: map[string]bool{}}
}

// TestOpTableRefusesDuplicates: the table is built in one place and a
// duplicate entry is a panic, not a silent overwrite.
func TestOpTableRefusesDuplicates(t *testing.T) {
	tab := newOpTable()
	if len(tab.server) == 0 || len(tab.object) != 13 {
		t.Fatalf("table: %d server ops, %d kinds; want every kind (13)", len(tab.server), len(tab.object))
	}
	for _, fam := range []string{"admin", "sync", "queue", "containers", "shm"} {
		found := false
		for _, o := range tab.server {
			found = found || o.family == fam
		}
		for _, ops := range tab.object {
			for _, o := range ops {
				found = found || o.family == fam
			}
		}
		if !found {
			t.Errorf("no op of family %q", fam)
		}
	}
	nop := func(*conn, uint64, wire.Args) (any, error) { return nil, nil }
	mustPanic(t, "duplicate object op", "defined twice", func() {
		tt := emptyTable()
		tt.objectOp("sync", []string{wire.KindLock}, wire.OpRelease, nop, nil)
		tt.objectOp("sync", []string{wire.KindRLock, wire.KindLock}, wire.OpRelease, nop, nil)
	})
	mustPanic(t, "duplicate server op", "defined twice", func() {
		tt := emptyTable()
		tt.serverOp("admin", wire.OpPing, nop)
		tt.serverOp("admin", wire.OpPing, nop)
	})
	mustPanic(t, "handler and granter", "exactly one", func() {
		emptyTable().objectOp("sync", []string{wire.KindLock}, wire.OpAcquire, nil, nil)
	})
}
