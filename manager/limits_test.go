package manager

import (
	"bytes"
	"testing"
	"time"
)

// TestByteLimits: every way bytes enter or leave a queue, dict or list is
// counted, a refused op changes nothing, and the count returns to zero.
func TestByteLimits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxObjectBytes = 10 * (100 + ItemOverhead)
	cfg.MaxBytes = 25 * (100 + ItemOverhead)
	m := newManager(t, cfg)
	s := newSession(t, m)
	ctx := testCtx(t)
	v := bytes.Repeat([]byte{1}, 100)

	t.Run("queue", func(t *testing.T) {
		q := create[*Queue](t, m, s, KindQueue, "q", Params{MaxSize: 5})
		for i := 0; i < 5; i++ {
			if err := q.Put(ctx, v, false, 0); err != nil {
				t.Fatal(err)
			}
		}
		// Waiting putters hold their items too: five fit, the sixth not.
		done := make(chan error, 5)
		for i := 0; i < 5; i++ {
			go func() { done <- q.Put(ctx, v, true, 200*time.Millisecond) }()
		}
		deadline := time.Now().Add(5 * time.Second)
		for _, w := q.Describe(); w < 5 && time.Now().Before(deadline); _, w = q.Describe() {
			time.Sleep(time.Millisecond)
		}
		if err := q.Put(ctx, v, true, Forever); !isErr(err, ErrLimit) {
			t.Fatalf("put past the object's bytes: %v", err)
		}
		for i := 0; i < 5; i++ {
			if err := <-done; err != ErrFull {
				t.Fatalf("waiting put: %v, want full after its timeout", err)
			}
		}
		if got := m.UsedBytes(); got != 5*ItemCost(v) {
			t.Fatalf("after the putters timed out: %d bytes counted, want %d", got, 5*ItemCost(v))
		}
		it, err := q.Get(ctx, false, 0)
		if err != nil {
			t.Fatal(err)
		}
		_ = q.Unget(it) // an undo is counted but never refused
		m.Delete("q")
		if got := m.UsedBytes(); got != 0 {
			t.Fatalf("after delete: %d bytes counted", got)
		}
	})

	t.Run("dict and list", func(t *testing.T) {
		d := create[*Dict](t, m, s, KindDict, "d", Params{})
		l := create[*List](t, m, s, KindList, "l", Params{})
		e := func(k string) DictEntry { return DictEntry{Key: []byte(k), KeyP: nil, Value: v} }
		es := []DictEntry{e("a"), e("b"), e("c"), e("d"), e("e"), e("f"), e("g"), e("h"), e("i"), e("j"), e("k")}
		if err := d.Update(es); !isErr(err, ErrLimit) || d.Len() != 0 {
			t.Fatalf("update of 11 entries: %v, len %d", err, d.Len())
		}
		if err := d.Update(es[:9]); err != nil {
			t.Fatal(err)
		}
		if err := d.Set(e("a")); err != nil { // a replacement adds nothing
			t.Fatal(err)
		}
		if err := l.Extend(v, v, v, v, v, v, v, v, v, v); err != nil {
			t.Fatal(err)
		}
		// 19 items counted: the total (25) has room for 6 more, the list for none.
		if err := l.Insert(0, v); !isErr(err, ErrLimit) || l.Len() != 10 {
			t.Fatalf("insert into a full list: %v, len %d", err, l.Len())
		}
		if ok, err := l.Replace([][]byte{v}, nil); !ok || err != nil {
			t.Fatalf("replace: %v %v", ok, err)
		}
		if _, err := l.Pop(-1); err != nil {
			t.Fatal(err)
		}
		d.Clear()
		if got := m.UsedBytes(); got != 0 {
			t.Fatalf("after clear and pop: %d bytes counted", got)
		}
	})
}
