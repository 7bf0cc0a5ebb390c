package tests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/proxy"
)

// TestWeakKeysAndFailedHandshakeBackoff (issue 12, item 11): a short key is
// refused at start, a key file others can read is warned about, and wrong
// keys from one source are slowed to a handful per second.
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
	d := &daemon{t: t, sock: filepath.Join(dir, "k.sock"), key: newKey(t)}
	must(t, os.WriteFile(keyFile, []byte(d.key+"\n"), 0o644))
	must(t, os.Chmod(keyFile, 0o644))
	startWith(t, d, env(), "--authkey-file", keyFile)
	if !strings.Contains(d.stderr.String(), "other users") {
		t.Fatalf("no warning about a 0644 key file:\n%s", d.stderr)
	}

	wrong := make([]byte, 32)
	copy(wrong, d.keyBytes())
	wrong[0] ^= 0xff
	start := time.Now()
	guesses, refused := 0, 0
	for time.Since(start) < 2*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := proxy.Dial(ctx, d.sock, wrong)
		cancel()
		switch {
		case errors.Is(err, auth.ErrAuthFailed):
			guesses++ // the daemon checked this key
		case err != nil && strings.Contains(err.Error(), "too many failed handshakes"):
			refused++
		default:
			t.Fatalf("wrong key: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("wrong keys in 2 s: %d checked, %d refused by the back-off", guesses, refused)
	if guesses > 20 || refused == 0 {
		t.Fatalf("%d wrong keys checked in 2 s (%d refused): no back-off", guesses, refused)
	}
	// The back-off ends: the right key gets in, and that clears the record.
	deadline := time.Now().Add(bound)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := proxy.Dial(ctx, d.sock, d.keyBytes())
		cancel()
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the right key is still refused: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	call(t, d.dial(t), "ping", nil)
}
