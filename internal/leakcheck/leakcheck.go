// Package leakcheck fails a test binary whose tests leave goroutines behind.
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
//
// Goroutines running before the tests started are ignored; the ones started
// since get a short time to finish after the last test.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Settle is how long goroutines get to finish after the tests.
var Settle = 5 * time.Second

// Main runs the tests, then reports leaked goroutines with their stacks. It
// returns the exit code for os.Exit.
func Main(m *testing.M) int {
	before := make(map[string]bool)
	for _, g := range goroutines() {
		before[g.id] = true
	}
	code := m.Run()
	if code != 0 {
		return code
	}
	deadline := time.Now().Add(Settle)
	for {
		var leaked []string
		for _, g := range goroutines() {
			if !before[g.id] && !ignored(g.stack) {
				leaked = append(leaked, g.stack)
			}
		}
		if len(leaked) == 0 {
			return code
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "leakcheck: %d goroutines still running %v after the tests:\n\n%s\n",
				len(leaked), Settle, strings.Join(leaked, "\n\n"))
			return 1
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type goroutine struct{ id, stack string }

// goroutines returns every goroutine but the calling one.
func goroutines() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutine
	for i, s := range bytes.Split(buf, []byte("\n\n")) {
		if i == 0 { // the caller's own
			continue
		}
		rest, ok := bytes.CutPrefix(s, []byte("goroutine "))
		if !ok {
			continue
		}
		id, _, _ := bytes.Cut(rest, []byte(" "))
		if _, err := strconv.Atoi(string(id)); err != nil {
			continue
		}
		out = append(out, goroutine{id: string(id), stack: string(s)})
	}
	return out
}

// ignored reports goroutines of the runtime and the testing package.
func ignored(stack string) bool {
	for _, s := range []string{"testing.(*M).", "testing.tRunner.func", "os/signal.signal_recv", "runtime.ensureSigM"} {
		if strings.Contains(stack, s) && !strings.Contains(stack, "github.com/syncmgr/") {
			return true
		}
	}
	return false
}
