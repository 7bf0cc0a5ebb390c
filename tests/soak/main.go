// Command soak is syncmgr's load test: many client processes doing mixed
// operations against the real daemon while random clients are SIGKILLed and
// replaced, with the invariants checked as it goes and at the end.
//
//	go run ./tests/soak -bin bin/syncmgr -clients 64 -ops 2000
//
// Invariants (each violation is counted and fails the run):
//   - a Lock is never held by two clients at once: each holder marks an
//     owner Value with compare-and-set on entry and exit;
//   - the counter incremented under the Lock ends at the number of logged
//     increments (plus at most one per killed client, whose last increment
//     may not have been logged);
//   - every queue item put is got at most once, and is got or still queued
//     at the end (minus at most one per killed consumer, which may have died
//     holding it);
//   - the atomic Value ends at the number of logged adds (plus at most one
//     per kill);
//   - the BoundedSemaphore's units are all back at the end (none lost with a
//     killed holder, by CAS or through the daemon; none made), and no
//     release of a held unit is refused;
//   - once the clients are gone, the daemon's goroutine count is back to its
//     baseline and its RSS is reported.
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
)

func main() {
	worker := flag.Int("worker", 0, "internal: run as worker with this id")
	addr := flag.String("address", "", "internal: daemon address for workers")
	bin := flag.String("bin", "bin/syncmgr", "the syncmgr binary")
	clients := flag.Int("clients", 64, "client processes at once")
	ops := flag.Int("ops", 2000, "operations per client")
	killEvery := flag.Duration("kill-every", 150*time.Millisecond, "SIGKILL a random client this often (0: never)")
	maxTime := flag.Duration("max-time", 5*time.Minute, "fail if the run takes longer")
	fastEvery := flag.Int("fast-every", 2, "every n-th client uses the same-host fast path (0: none)")
	flag.Parse()
	if *worker > 0 {
		os.Exit(runWorker(*worker, *addr, *ops, *fastEvery > 0 && *worker%*fastEvery == 0))
	}
	if err := drive(*bin, *clients, *ops, *killEvery, *maxTime, *fastEvery); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func key() []byte {
	k, _ := hex.DecodeString(os.Getenv("SYNCMGR_AUTHKEY"))
	return k
}

// runWorker does ops mixed operations and logs each completed one on
// stdout: "L" an increment under the lock, "A" an atomic add, "P item" a
// put, "G item" a get, "S x" a stale owner mark found, "V msg" a violation.
func runWorker(id int, addr string, ops int, fast bool) int {
	ctx := context.Background()
	opts := []proxy.Option{proxy.WithLabel(fmt.Sprintf("soak worker %d", id))}
	if fast {
		opts = append(opts, proxy.WithFastPath()) // Lock and Semaphore ops by compare-and-swap, mixed with socket clients
	}
	c, err := proxy.Dial(ctx, addr, key(), opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker dial:", err)
		return 2
	}
	defer c.Close()
	out := os.Stdout // unbuffered: each line is written before the next op starts
	lock, _ := c.Lock(ctx, "soak.lock")
	owner, _ := c.Value(ctx, "soak.owner", "q", 0)
	counter, _ := c.Value(ctx, "soak.counter", "q", 0)
	atomic, _ := c.Value(ctx, "soak.atomic", "q", 0)
	q, _ := c.Queue(ctx, "soak.q", 500)
	ev, _ := c.Event(ctx, "soak.ev")
	sem, _ := c.BoundedSemaphore(ctx, "soak.sem", soakUnits)
	r := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	me := int64(id)
	for i := 0; i < ops; i++ {
		tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		switch n := r.IntN(10); {
		case n < 3: // critical section
			if err := lock.Acquire(tctx); err != nil {
				cancel()
				fmt.Fprintln(os.Stderr, "acquire:", err)
				return 3
			}
			if ok, _ := owner.CompareAndSet(tctx, int64(0), me); !ok {
				cur, _ := owner.Get(tctx)
				fmt.Fprintf(out, "S %v\n", cur) // stale mark of a killed holder, or a violation
				_ = owner.Set(tctx, me)
			}
			v, _ := counter.Get(tctx)
			_ = counter.Set(tctx, v.(int64)+1)
			fmt.Fprintln(out, "L")
			if ok, _ := owner.CompareAndSet(tctx, me, int64(0)); !ok {
				cur, _ := owner.Get(tctx)
				fmt.Fprintf(out, "V owner changed to %v while %d held the lock\n", cur, id)
			}
			_ = lock.Release(tctx)
		case n < 5:
			if _, err := atomic.Add(tctx, int64(1)); err == nil {
				fmt.Fprintln(out, "A")
			} else {
				fmt.Fprintln(out, "N")
			}
		case n < 7:
			item := fmt.Sprintf("%d:%d", id, i)
			if err := q.Put(tctx, item); err == nil {
				fmt.Fprintln(out, "P", item)
			} else {
				fmt.Fprintln(out, "N")
			}
		case n < 9:
			gctx, gcancel := context.WithTimeout(ctx, 50*time.Millisecond)
			if b, err := q.Get(gctx); err == nil {
				fmt.Fprintln(out, "G", b)
			} else {
				fmt.Fprintln(out, "N")
			}
			gcancel()
		default:
			if r.IntN(2) == 0 {
				_, _ = ev.IsSet(tctx)
				fmt.Fprintln(out, "N")
				break
			}
			if err := sem.Acquire(tctx); err != nil {
				cancel()
				fmt.Fprintln(os.Stderr, "semaphore acquire:", err)
				return 3
			}
			if err := sem.Release(tctx); err != nil {
				fmt.Fprintf(out, "V release of a held semaphore unit refused: %v\n", err)
			}
			fmt.Fprintln(out, "N")
		}
		cancel()
	}
	return 0
}

// soakUnits is the soak BoundedSemaphore's value.
const soakUnits = 2

type tally struct {
	mu         sync.Mutex
	increments int
	adds       int
	put        map[string]bool
	got        map[string]int
	stale      []string
	violations []string
	killed     map[int]bool
	ops        int
}

func drive(bin string, nclients, ops int, killEvery, maxTime time.Duration, fastEvery int) error {
	dir, err := os.MkdirTemp("/tmp", "soak")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	if os.Getenv("SYNCMGR_AUTHKEY") == "" {
		k, _ := exec.Command(bin, "keygen").Output()
		os.Setenv("SYNCMGR_AUTHKEY", strings.TrimSpace(string(k)))
	}
	daemon := exec.Command(bin, "serve", "--socket", sock, "--log-level", "warn", "--shm-dir", "none")
	daemon.Stderr = os.Stderr
	if err := daemon.Start(); err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	defer func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		_ = daemon.Wait()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), maxTime)
	defer cancel()
	var c *proxy.Client
	for i := 0; ; i++ {
		c, err = proxy.Dial(ctx, sock, key(), proxy.WithLabel("soak driver"))
		if err == nil {
			break
		}
		if i > 100 {
			return fmt.Errorf("daemon never answered: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer c.Close()
	base, err := stats(ctx, c)
	if err != nil {
		return err
	}
	self, _ := os.Executable()
	t := &tally{put: map[string]bool{}, got: map[string]int{}, killed: map[int]bool{}}
	var (
		mu      sync.Mutex
		running = map[int]*exec.Cmd{}
		wg      sync.WaitGroup
		nextID  = 0
		spawned = 0
		target  = nclients * ops
	)
	spawn := func() error {
		mu.Lock()
		nextID++
		id := nextID
		spawned++
		mu.Unlock()
		cmd := exec.Command(self, "-worker", strconv.Itoa(id), "-address", sock, "-ops", strconv.Itoa(ops), "-fast-every", strconv.Itoa(fastEvery))
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		mu.Lock()
		running[id] = cmd
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				t.record(sc.Text())
			}
			err := cmd.Wait()
			mu.Lock()
			delete(running, id)
			mu.Unlock()
			t.mu.Lock()
			if err != nil && !t.killed[id] {
				t.violations = append(t.violations, fmt.Sprintf("worker %d failed: %v", id, err))
			}
			t.mu.Unlock()
		}()
		return nil
	}
	var peakRSS, peakGoroutines int64
	sampleDone := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() { // peak daemon footprint during the run
		defer close(sampleDone)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				if s, err := stats(ctx, c); err == nil {
					peakRSS = max(peakRSS, num(s["rss"]))
					peakGoroutines = max(peakGoroutines, num(s["goroutines"]))
				}
			}
		}
	}()
	start := time.Now()
	for i := 0; i < nclients; i++ {
		if err := spawn(); err != nil {
			return err
		}
	}
	kills := 0
	if killEvery > 0 {
		tick := time.NewTicker(killEvery)
	loop:
		for {
			select {
			case <-ctx.Done():
				return fmt.Errorf("run took longer than %v", maxTime)
			case <-tick.C:
				t.mu.Lock()
				done := t.ops
				t.mu.Unlock()
				mu.Lock()
				idle := len(running) == 0
				mu.Unlock()
				if done >= target/2 || idle {
					break loop
				}
				mu.Lock()
				var victim *exec.Cmd
				vid := 0
				for id, cmd := range running {
					victim, vid = cmd, id
					break
				}
				mu.Unlock()
				if victim != nil {
					t.mu.Lock()
					t.killed[vid] = true
					t.mu.Unlock()
					_ = victim.Process.Kill()
					kills++
					if err := spawn(); err != nil {
						return err
					}
				}
			}
		}
		tick.Stop()
	}
	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-ctx.Done():
		return fmt.Errorf("clients did not finish within %v", maxTime)
	}
	elapsed := time.Since(start)
	close(stopSampling)
	<-sampleDone

	// Final state.
	q, _ := c.Queue(ctx, "soak.q", 500)
	remaining := map[string]bool{}
	for {
		b, err := q.TryGet(ctx)
		if err != nil {
			if !errors.Is(err, proxy.ErrEmpty) {
				return fmt.Errorf("drain queue: %w", err)
			}
			break
		}
		remaining[fmt.Sprint(b)] = true
	}
	counterV, _ := c.Value(ctx, "soak.counter", "q", 0)
	atomicV, _ := c.Value(ctx, "soak.atomic", "q", 0)
	counter, _ := counterV.Get(ctx)
	atomic, _ := atomicV.Get(ctx)
	semFree, err := semaphoreUnits(ctx, c)
	if err != nil {
		return err
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	var viol []string
	viol = append(viol, t.violations...)
	for _, s := range t.stale {
		id, _ := strconv.Atoi(s)
		if !t.killed[id] {
			viol = append(viol, fmt.Sprintf("lock owner mark %s found by a new holder, and %s was not killed: two holders", s, s))
		}
	}
	for item, n := range t.got {
		if n > 1 {
			viol = append(viol, fmt.Sprintf("item %s got %d times", item, n))
		}
		if remaining[item] {
			viol = append(viol, fmt.Sprintf("item %s got and still queued", item))
		}
		if !t.put[item] && !t.killed[producer(item)] {
			viol = append(viol, fmt.Sprintf("item %s got but never put", item))
		}
	}
	lost := 0
	for item := range t.put {
		if t.got[item] == 0 && !remaining[item] {
			lost++
		}
	}
	nkilled := len(t.killed)
	if lost > nkilled {
		viol = append(viol, fmt.Sprintf("%d items put were neither got nor queued; at most %d (one per killed client) may be in flight", lost, nkilled))
	}
	if d := int(counter.(int64)) - t.increments; d < 0 || d > nkilled {
		viol = append(viol, fmt.Sprintf("counter under lock is %v, logged increments %d, kills %d", counter, t.increments, nkilled))
	}
	if d := int(atomic.(int64)) - t.adds; d < 0 || d > nkilled {
		viol = append(viol, fmt.Sprintf("atomic value is %v, logged adds %d, kills %d", atomic, t.adds, nkilled))
	}
	if semFree != soakUnits {
		viol = append(viol, fmt.Sprintf("semaphore has %d units free after the run, want %d", semFree, soakUnits))
	}

	// The daemon returns to its baseline once the clients are gone.
	var after map[string]any
	deadline := time.Now().Add(10 * time.Second)
	for {
		after, err = stats(ctx, c)
		if err != nil {
			return err
		}
		if num(after["goroutines"]) <= num(base["goroutines"])+2 && num(after["sessions"]) <= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if g, b := num(after["goroutines"]), num(base["goroutines"]); g > b+2 {
		viol = append(viol, fmt.Sprintf("daemon goroutines %d after the run, %d before", g, b))
	}
	// Go returns freed heap to the OS lazily, so RSS is held to a bound
	// rather than to the exact baseline.
	if a, b := num(after["rss"]), num(base["rss"]); a > b+64<<20 {
		viol = append(viol, fmt.Sprintf("daemon rss %.1f MiB after the run, %.1f MiB before: more than 64 MiB retained", mib(a), mib(b)))
	}
	fmt.Printf("soak: %d clients at once, %d spawned, %d SIGKILLed, %d operations in %.1fs (%.0f ops/s)\n",
		nclients, spawned, kills, t.ops, elapsed.Seconds(), float64(t.ops)/elapsed.Seconds())
	fmt.Printf("soak: lock increments %d (counter %v), atomic adds %d (value %v), items put %d, got %d, still queued %d, in flight with killed clients %d\n",
		t.increments, counter, t.adds, atomic, len(t.put), len(t.got), len(remaining), lost)
	fmt.Printf("soak: semaphore units free after the run %d of %d\n", semFree, soakUnits)
	fmt.Printf("soak: daemon rss %.1f MiB before, %.1f MiB peak, %.1f MiB after; goroutines %d before, %d peak, %d after; sessions after %d\n",
		mib(num(base["rss"])), mib(peakRSS), mib(num(after["rss"])), num(base["goroutines"]), peakGoroutines, num(after["goroutines"]), num(after["sessions"]))
	fmt.Printf("soak: invariant violations: %d\n", len(viol))
	for _, v := range viol {
		fmt.Println("  violation:", v)
	}
	if len(viol) > 0 {
		return errors.New("invariants violated")
	}
	return nil
}

// semaphoreUnits counts the soak semaphore's free units once every client
// session has ended (a killed holder's units come back at its session end),
// taking them all and giving them back.
func semaphoreUnits(ctx context.Context, c *proxy.Client) (int, error) {
	sem, err := c.BoundedSemaphore(ctx, "soak.sem", soakUnits)
	if err != nil {
		return 0, err
	}
	n := 0
	for deadline := time.Now().Add(10 * time.Second); n < soakUnits && time.Now().Before(deadline); {
		ok, err := sem.TryAcquire(ctx)
		if err != nil {
			return 0, err
		}
		if ok {
			n++
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if ok, err := sem.TryAcquire(ctx); err != nil {
		return 0, err
	} else if ok {
		n++ // one too many: a unit was made
	}
	for i := 0; i < n; i++ {
		if err := sem.Release(ctx); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func producer(item string) int {
	id, _ := strconv.Atoi(strings.SplitN(item, ":", 2)[0])
	return id
}

func (t *tally) record(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	kind, rest, _ := strings.Cut(line, " ")
	switch kind {
	case "L":
		t.increments++
	case "A":
		t.adds++
	case "P":
		t.put[rest] = true
	case "G":
		t.got[rest]++
	case "S":
		t.stale = append(t.stale, rest)
	case "V":
		t.violations = append(t.violations, rest)
	case "N": // an operation with nothing to tally
	default:
		return
	}
	t.ops++
}

func stats(ctx context.Context, c *proxy.Client) (map[string]any, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	s, _ := st["server"].(map[string]any)
	return s, nil
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

func num(x any) int64 {
	switch v := x.(type) {
	case int64:
		return v
	case uint64:
		return int64(v)
	}
	return 0
}
