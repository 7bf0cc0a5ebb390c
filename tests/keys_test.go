package tests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/proxy"
)

// TestWeakKeysAndFailedHandshakeBackoff (issue 12, item 11; issue 22,
// finding 3): a short key is refused at start, a key file others can read
// is warned about, and wrong keys from one source are slowed to a handful
// per second, on the Unix socket (the source is the uid) and over TCP (the
// address), while the right key from the same uid and address is never
// refused nor slowed: after the failures, with the back-off at its height,
// every right-key connection gets in at once, and so does a second
// connection of a client already connected.
func TestWeakKeysAndFailedHandshakeBackoff(t *testing.T) {
	dir := shortDir(t)
	_, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY=00"), "serve", "--socket", filepath.Join(dir, "w.sock"), "--shm-dir", "none")
	if code != 2 || !strings.Contains(stderr, "too short") {
		t.Fatalf("1-byte key: exit %d, %q", code, stderr)
	}
	_, stderr, code = runCmd(t, env("SYNCMGR_AUTHKEY=00112233445566778899aabbccddee"), "serve", "--socket", filepath.Join(dir, "w.sock"), "--shm-dir", "none")
	if code != 2 || !strings.Contains(stderr, "too short") {
		t.Fatalf("15-byte key: exit %d, %q", code, stderr)
	}

	keyFile := filepath.Join(dir, "key")
	tcpAddr := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t))
	d := &daemon{t: t, sock: filepath.Join(dir, "k.sock"), key: newKey(t)}
	must(t, os.WriteFile(keyFile, []byte(d.key+"\n"), 0o644))
	must(t, os.Chmod(keyFile, 0o644))
	startWith(t, d, env(), "--authkey-file", keyFile, "--tcp", tcpAddr)
	if !strings.Contains(d.stderr.String(), "other users") {
		t.Fatalf("no warning about a 0644 key file:\n%s", d.stderr)
	}
	first := d.dial(t) // connected before the failures

	wrong := make([]byte, 32)
	copy(wrong, d.keyBytes())
	wrong[0] ^= 0xff
	for _, address := range []string{d.sock, "tcp://" + tcpAddr} {
		start := time.Now()
		guesses, slowed := 0, 0
		for time.Since(start) < 2*time.Second {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			_, err := proxy.Dial(ctx, address, wrong)
			cancel()
			switch {
			case errors.Is(err, auth.ErrAuthFailed):
				guesses++ // the daemon answered: wrong key
			case err != nil && (errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout")):
				slowed++ // the answer waits out the back-off
			default:
				t.Fatalf("wrong key on %s: %v", address, err)
			}
		}
		t.Logf("%s: wrong keys in 2 s: %d answered, %d still waiting for their answer after 0.5 s", address, guesses, slowed)
		if guesses > 20 || slowed == 0 {
			t.Fatalf("%s: %d wrong keys answered in 2 s (%d slowed): no back-off", address, guesses, slowed)
		}
		// The back-off is at its height: the right key from the same uid
		// and address gets in at once, every time.
		for i := range 20 {
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			t0 := time.Now()
			c, err := proxy.Dial(ctx, address, d.keyBytes())
			cancel()
			if err != nil {
				t.Fatalf("%s: the right key was refused after others' wrong keys (attempt %d): %v", address, i, err)
			}
			if el := time.Since(t0); el > 2*time.Second {
				t.Fatalf("%s: the right key waited %v behind others' wrong keys", address, el)
			}
			call(t, c, "ping", nil)
			c.Close()
		}
	}
	// A client connected before it all still opens more connections.
	call(t, first, "ping", nil)
	call(t, d.dial(t), "ping", nil)
}
