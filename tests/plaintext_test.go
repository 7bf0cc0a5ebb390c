package tests

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlaintextTCPOffLoopbackNeedsInsecure (issue 12, item 4): without TLS,
// frames after the handshake carry no integrity, so the daemon refuses
// plaintext TCP on any address but loopback unless --insecure says so.
func TestPlaintextTCPOffLoopbackNeedsInsecure(t *testing.T) {
	key := newKey(t)
	for _, addr := range []string{"0.0.0.0:%d", ":%d", "[::]:%d"} {
		a := fmt.Sprintf(addr, freeTCPPort(t))
		_, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+key), "serve", "--socket", "none", "--shm-dir", "none", "--tcp", a)
		if code != 2 || !strings.Contains(stderr, "without TLS") || !strings.Contains(stderr, "--insecure") {
			t.Fatalf("--tcp %s without TLS: exit %d, %q", a, code, stderr)
		}
	}
	// Loopback stays allowed, and --insecure allows the rest (with a warning).
	lo := startDaemon(t, "--tcp", fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t)))
	call(t, lo.dial(t), "ping", nil)
	d := &daemon{t: t, sock: filepath.Join(shortDir(t), "i.sock"), key: key}
	d.start("--tcp", fmt.Sprintf("0.0.0.0:%d", freeTCPPort(t)), "--insecure")
	t.Cleanup(d.stop)
	if !strings.Contains(d.stderr.String(), "neither encrypted nor authenticated") {
		t.Fatalf("no warning with --insecure:\n%s", d.stderr)
	}
}
