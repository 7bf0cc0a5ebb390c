package tests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
)

// Each subcommand's -h starts with its synopsis and one line saying what it
// does, exits 0, and shows every default once.
func TestEverySubcommandHelpSaysWhatItDoes(t *testing.T) {
	for _, sub := range []string{"serve", "status", "keygen", "version"} {
		out, stderr, code := runCmd(t, env(), sub, "-h")
		if code != 0 {
			t.Fatalf("%s -h: exit %d, %q", sub, code, stderr)
		}
		lines := strings.Split(out, "\n")
		if len(lines) < 3 || !strings.HasPrefix(lines[0], "Usage: syncmgr "+sub) || lines[1] != "" ||
			len(lines[2]) < 20 || !strings.HasSuffix(lines[2], ".") {
			t.Fatalf("%s -h does not start with a synopsis and a line saying what it does:\n%s", sub, out)
		}
		for i, l := range lines {
			if n := strings.Count(l, "(default"); n > 1 || n == 1 && strings.Contains(l, "default:") {
				t.Errorf("%s -h line %d shows a default twice: %q", sub, i+1, l)
			}
		}
		if sub == "serve" || sub == "status" {
			if !strings.Contains(out, "one dash or two") {
				t.Errorf("%s -h does not say that both dash forms work", sub)
			}
		}
	}
	out, _, _ := runCmd(t, env(), "status", "-h")
	if !regexp.MustCompile(`(?m)^  -limit int\n\s+list at most this many objects`).MatchString(out) {
		t.Errorf("status -h does not document -limit:\n%s", out)
	}
	// A bad flag is one line that points at the help, not the whole help.
	_, stderr, code := runCmd(t, env(), "status", "--bogus")
	if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "-bogus") || !strings.Contains(stderr, "syncmgr status -h") {
		t.Fatalf("status --bogus: exit %d, %q", code, stderr)
	}
}

// status against a socket nobody listens on names the fix, as the Python
// client does; so does the Go client's Dial.
func TestStatusWithoutDaemonSaysHowToStartOne(t *testing.T) {
	sock := filepath.Join(shortDir(t), "none.sock")
	_, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+newKey(t)), "status", "--address", sock)
	if code != 1 || !strings.Contains(stderr, "no syncmgr daemon is running at "+sock) ||
		!strings.Contains(stderr, "syncmgr serve --socket "+sock) || !strings.Contains(stderr, "SYNCMGR_ADDRESS") {
		t.Fatalf("exit %d, %q", code, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if _, err := proxy.Dial(ctx, sock, make([]byte, 32)); !errors.Is(err, proxy.ErrNoDaemon) {
		t.Fatalf("Dial: %v, want ErrNoDaemon", err)
	}
}

// A refused key names where it came from; with both variables set, which
// one was used and which ignored.
func TestWrongKeyNamesItsSource(t *testing.T) {
	d := startDaemon(t)
	dir := shortDir(t)
	good := filepath.Join(dir, "good.key")
	if err := os.WriteFile(good, []byte(d.key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+newKey(t), "SYNCMGR_AUTHKEY_FILE="+good), "status", "--address", d.sock)
	if code != 1 || !strings.Contains(stderr, "$SYNCMGR_AUTHKEY (") ||
		!strings.Contains(stderr, "SYNCMGR_AUTHKEY_FILE="+good+" is set too, and ignored") {
		t.Fatalf("both set, wrong env key: exit %d, %q", code, stderr)
	}
	bad := filepath.Join(dir, "bad.key")
	if err := os.WriteFile(bad, []byte(newKey(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = runCmd(t, env("SYNCMGR_AUTHKEY_FILE="+bad), "status", "--address", d.sock)
	if code != 1 || !strings.Contains(stderr, "the file "+bad+" named by $SYNCMGR_AUTHKEY_FILE") {
		t.Fatalf("wrong key file: exit %d, %q", code, stderr)
	}
	// The right key from the file, with no SYNCMGR_AUTHKEY, works.
	if out, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY_FILE="+good), "status", "--address", d.sock); code != 0 || !strings.HasPrefix(out, "syncmgr ") {
		t.Fatalf("right key file: exit %d, %q %q", code, out, stderr)
	}
}

// A graceful stop tells idle connections it is shutting down before it
// closes them: a Go client then fails with ErrShutdown, not a bare EOF.
func TestGracefulStopTellsIdleClients(t *testing.T) {
	d := startDaemon(t)
	c := d.dial(t)
	call(t, c, "ping", nil)
	if code, _ := d.signal(syscall.SIGTERM); code != 0 {
		t.Fatalf("daemon exit %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var err error
	for start := time.Now(); time.Since(start) < bound; time.Sleep(10 * time.Millisecond) {
		if _, err = c.Call(ctx, "ping", nil, nil); err != nil {
			break
		}
	}
	if !errors.Is(err, proxy.ErrShutdown) || !errors.Is(err, proxy.ErrConnectionLost) {
		t.Fatalf("call after a graceful stop: %v, want ErrConnectionLost wrapping ErrShutdown", err)
	}
}
