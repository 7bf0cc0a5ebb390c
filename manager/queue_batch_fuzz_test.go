package manager

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
)

// FuzzQueueBatch runs a sequence of batch and single ops, read from the
// input, against a Queue without a ring and one with a small ring, and
// checks each against a model FIFO: a put_many goes in whole or not at all,
// a get_many takes the head items in order, an undone get_many puts them
// all back, and the length always matches.
func FuzzQueueBatch(f *testing.F) {
	f.Add([]byte{3, 0, 2, 1, 1, 5, 2, 2, 0, 4, 3, 1})
	f.Add([]byte{0, 0, 9, 0, 9, 1, 3, 2, 1, 0, 1, 1, 30})
	f.Add([]byte{2, 0, 3, 3, 200, 1, 2, 0, 1, 150, 2, 9})
	f.Add([]byte{0, 0, 21, 0, 45, 0, 13, 1, 0x8e, 1, 0xf6, 2, 0x9d, 1, 6})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 1 || len(in) > 256 {
			return
		}
		maxsize := int64(in[0] % 8) // 0: unbounded
		for _, ring := range []bool{false, true} {
			var q *Queue
			if ring {
				q = ringQueue(t, smallRingManager(t), "fz", maxsize)
			} else {
				m := newManager(t, DefaultConfig())
				q = create[*Queue](t, m, newSession(t, m), KindQueue, "fz", Params{MaxSize: maxsize})
			}
			if err := runBatchOps(q, maxsize, in[1:]); err != nil {
				t.Fatalf("ring %v: %v", ring, err)
			}
		}
	})
}

func runBatchOps(q *Queue, maxsize int64, ops []byte) error {
	ctx := context.Background()
	var model [][]byte
	next := 0
	item := func(size byte) []byte {
		next++
		// Sizes up to 100 KiB: past the small ring's inline limit and past
		// SocketKeepMin, so that items go to the ring, to external records
		// and to over.
		b := bytes.Repeat([]byte{byte(next)}, 1+int(size)*400)
		return append(b, []byte(fmt.Sprint(next))...)
	}
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i]%4, ops[i+1]
		switch op {
		case 0, 3: // put_many of arg%6 items (op 3: a single put)
			k := 1 + int(arg%6)
			if op == 3 {
				k = 1
			}
			batch := make([][]byte, k)
			for j := range batch {
				batch[j] = item(arg >> 3)
			}
			var err error
			if op == 3 {
				err = q.Put(ctx, batch[0], false, 0)
			} else {
				_, err = q.PutManyGrant(ctx, batch, false, 0)
			}
			switch {
			case maxsize > 0 && int64(k) > maxsize:
				if !errors.Is(err, ErrValue) {
					return fmt.Errorf("a batch of %d over maxsize %d: %v", k, maxsize, err)
				}
			case maxsize > 0 && int64(len(model)+k) > maxsize:
				if err != ErrFull {
					return fmt.Errorf("a batch of %d with %d of %d held: %v, want full", k, len(model), maxsize, err)
				}
			case err != nil:
				return fmt.Errorf("put of %d: %v", k, err)
			default:
				model = append(model, batch...)
			}
		case 1, 2: // get_many of up to arg%7+1 items (op 2: then undone)
			k := 1 + int(arg%7)
			budget := int64(1 << 30)
			if arg&0x80 != 0 { // a reply budget that some items overrun: they stay the head
				budget = int64(arg&0x78) * 1000
			}
			g, err := q.GetManyGrant(ctx, k, budget, false, 0)
			if len(model) == 0 {
				if err != ErrEmpty {
					return fmt.Errorf("get_many of an empty queue: %v", err)
				}
				break
			}
			if err != nil {
				return fmt.Errorf("get_many: %v", err)
			}
			got := g.Items()
			want := model[:min(k, len(model))]
			used := int64(len(want[0])) + batchItemFraming // the first is taken whatever its size
			for j := 1; j < len(want); j++ {
				if used+int64(len(want[j]))+batchItemFraming > budget {
					want = want[:j]
					break
				}
				used += int64(len(want[j])) + batchItemFraming
			}
			if len(got) != len(want) {
				return fmt.Errorf("get_many(%d) of %d took %d", k, len(model), len(got))
			}
			for j := range got {
				if !bytes.Equal(got[j], want[j]) {
					return fmt.Errorf("get_many item %d out of order", j)
				}
			}
			if op == 2 {
				g.Undo()
			} else {
				g.Commit()
				model = model[len(got):]
			}
		}
		if n := q.Len(); n != len(model) {
			return fmt.Errorf("after op %d: Len %d, model %d", op, n, len(model))
		}
	}
	return nil
}
