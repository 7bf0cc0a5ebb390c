// Command interop is the Go side of tests/python/test_interop.py: it reaches
// the daemon through the environment (proxy.DialEnv), reads what Python
// stored, writes Go values back, and prints the Go types it decoded, one
// line each, for the Python test to check.
//
//	interop echo IN OUT N   move N items from queue IN to queue OUT, decoded and re-encoded
//	interop objects P       read and write P-value, P-dict, P-list and P-ns
//	interop ring Q G P      on the fast path: get G items from queue Q, then put P
//	                        items back (go-0, 1, go-2, ..., then every Pickle got)
//	interop jring Q N       on the fast path, JoinableQueue Q: get N items, then,
//	                        once a line comes on stdin, mark N tasks done (see jring)
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var opts []proxy.Option
	if len(args) > 0 && (args[0] == "ring" || args[0] == "jring") {
		opts = append(opts, proxy.WithFastPath())
	}
	c, err := proxy.DialEnv(ctx, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	switch {
	case len(args) == 4 && args[0] == "echo":
		n, err := strconv.Atoi(args[3])
		if err != nil {
			return err
		}
		in, err := c.Queue(ctx, args[1], 0)
		if err != nil {
			return err
		}
		out, err := c.Queue(ctx, args[2], 0)
		if err != nil {
			return err
		}
		for range n {
			v, err := in.Get(ctx)
			if err != nil {
				return err
			}
			fmt.Printf("%T\n", v)
			if err := out.Put(ctx, v); err != nil {
				return err
			}
		}
		return nil
	case len(args) == 2 && args[0] == "objects":
		return objects(ctx, c, args[1])
	case len(args) == 4 && args[0] == "ring":
		return ring(ctx, c, args[1], args[2], args[3])
	case len(args) == 3 && args[0] == "jring":
		return jring(ctx, c, args[1], args[2])
	}
	return fmt.Errorf("usage: interop echo IN OUT N | interop objects PREFIX | interop ring Q GETS PUTS | interop jring Q N")
}

func show(what string, v any, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	fmt.Printf("%s %T %v\n", what, v, v)
	return nil
}

func objects(ctx context.Context, c *proxy.Client, p string) error {
	v, err := c.Value(ctx, p+"-value", "O", nil)
	if err != nil {
		return err
	}
	got, err := v.Get(ctx)
	if err := show("value", got, err); err != nil {
		return err
	}
	if err := v.Set(ctx, map[string]any{"from": "go", "n": []any{1, 2.5, nil}, "raw": []byte{0, 1}}); err != nil {
		return err
	}

	d, err := c.Dict(ctx, p+"-dict")
	if err != nil {
		return err
	}
	for _, k := range []any{"py-key", 1, []any{1, "a"}} { // 1 finds Python's 1.0 and True; the slice its tuple
		got, err := d.Get(ctx, k)
		if err := show(fmt.Sprintf("dict[%v]", k), got, err); err != nil {
			return err
		}
	}
	if err := d.Set(ctx, "go-key", []any{"from", "go"}); err != nil {
		return err
	}
	if err := d.Set(ctx, 3, "three"); err != nil {
		return err
	}
	if err := d.Set(ctx, []any{1, 2}, "no"); err == nil {
		return fmt.Errorf("a slice key was accepted for Set")
	}
	items, err := d.Items(ctx)
	if err != nil {
		return err
	}
	for _, e := range items {
		fmt.Printf("item %T %T\n", e.Key, e.Value)
	}

	l, err := c.List(ctx, p+"-list")
	if err != nil {
		return err
	}
	n, err := l.Len(ctx)
	if err != nil {
		return err
	}
	for i := range n {
		got, err := l.Get(ctx, i)
		if err := show(fmt.Sprintf("list[%d]", i), got, err); err != nil {
			return err
		}
	}
	if err := l.Append(ctx, map[string]any{"go": true}); err != nil {
		return err
	}

	ns, err := c.Namespace(ctx, p+"-ns")
	if err != nil {
		return err
	}
	got, err = ns.Attr(ctx, "from_py")
	if err := show("ns.from_py", got, err); err != nil {
		return err
	}
	return ns.SetAttr(ctx, "from_go", 42)
}

// ring gets and puts on a Queue with the Go client's fast path (when the
// environment allows it: SYNCMGR_FASTPATH=0 turns it off), printing first
// whether the client and the queue are on it, then each item got.
func ring(ctx context.Context, c *proxy.Client, name, gets, puts string) error {
	g, err := strconv.Atoi(gets)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(puts)
	if err != nil {
		return err
	}
	q, err := c.Queue(ctx, name, 0)
	if err != nil {
		return err
	}
	fast, _ := c.FastPath()
	fmt.Printf("fast=%v ring=%v\n", fast, q.FastPath())
	var pickles []any
	for range g {
		v, err := q.Get(ctx)
		if err != nil {
			return err
		}
		if _, ok := v.(proxy.Pickle); ok {
			pickles = append(pickles, v)
		}
		fmt.Printf("%T %v\n", v, v)
	}
	for i := range p {
		var v any = fmt.Sprintf("go-%d", i)
		if i%2 == 1 {
			v = i
		}
		if err := q.Put(ctx, v); err != nil {
			return err
		}
	}
	for _, v := range pickles {
		if err := q.Put(ctx, v); err != nil {
			return err
		}
	}
	return nil
}

// jring works on a JoinableQueue with the Go client's fast path (when the
// environment allows it), printing one line per step for the Python side:
// "fast=.. ring=..", each of the n items it gets, "got"; then, once a line
// comes on stdin (Python has marked Go's items done and got n items of its
// own), "pending" after n-1 task_dones (a join must not return yet); then,
// after another line on stdin, "joined" once the last one let Join return,
// and "too-many" when one more task_done is refused.
func jring(ctx context.Context, c *proxy.Client, name, count string) error {
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return fmt.Errorf("bad count %q", count)
	}
	q, err := c.JoinableQueue(ctx, name, 0)
	if err != nil {
		return err
	}
	fast, _ := c.FastPath()
	fmt.Printf("fast=%v ring=%v\n", fast, q.FastPath())
	for range n {
		v, err := q.Get(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("%T %v\n", v, v)
	}
	fmt.Println("got")
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if i == n-1 {
			jctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			err := q.Join(jctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("join with one task unfinished: %v", err)
			}
			fmt.Println("pending")
			if _, err := in.ReadString('\n'); err != nil { // Python has seen its join still waiting
				return err
			}
		}
		if err := q.TaskDone(ctx); err != nil {
			return fmt.Errorf("task_done %d: %w", i, err)
		}
	}
	if err := q.Join(ctx); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	fmt.Println("joined")
	if err := q.TaskDone(ctx); !errors.Is(err, &wire.Error{Code: wire.CodeValueError}) {
		return fmt.Errorf("one task_done too many: %v", err)
	}
	fmt.Println("too-many")
	return nil
}
