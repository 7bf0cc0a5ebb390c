package tests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncmgr/syncmgr/proxy"
)

// TestSocketDirectoryOfAnotherUserIsRefused (issue 12, item 6): the daemon
// refuses a socket directory that another user owns or that group or others
// may write (there another user can replace the socket), and the Go client
// refuses a socket whose listener runs as another user (SO_PEERCRED), before
// sending anything.
func TestSocketDirectoryOfAnotherUserIsRefused(t *testing.T) {
	base := shortDir(t)
	groupWritable := filepath.Join(base, "gw")
	must(t, os.Mkdir(groupWritable, 0o770))
	must(t, os.Chmod(groupWritable, 0o770))
	cases := map[string]string{"group-writable": groupWritable}
	if os.Geteuid() == 0 {
		for name, mode := range map[string]os.FileMode{"other user's 0700": 0o700, "other user's 1777": 0o1777} {
			dir := filepath.Join(base, strings.ReplaceAll(name[len(name)-4:], " ", ""))
			must(t, os.Mkdir(dir, mode))
			must(t, os.Chmod(dir, mode))
			must(t, os.Chown(dir, attackerUID, attackerUID))
			cases[name] = dir
		}
	} else {
		t.Log("not root: the cases of another user's directory are skipped (they need chown)")
	}
	key := newKey(t)
	for name, dir := range cases {
		_, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+key), "serve", "--socket", filepath.Join(dir, "s.sock"), "--shm-dir", "none")
		if code == 0 || !strings.Contains(stderr, "socket directory refused") {
			t.Errorf("%s: exit %d, %q", name, code, stderr)
		}
		if _, err := os.Lstat(filepath.Join(dir, "s.sock")); err == nil {
			t.Errorf("%s: a socket was created", name)
		}
	}

	// The client side: a listener run by another user is not spoken to.
	needRoot(t)
	bin := sharedBin(t)
	home := shortDir(t)
	must(t, os.Chown(home, attackerUID, attackerUID))
	d := &daemon{t: t, sock: filepath.Join(home, "a.sock"), key: key, dialOpts: []proxy.Option{proxy.WithServerUID(attackerUID)}}
	d.startArgv(asUser(attackerUID, bin, "serve", "--socket", d.sock, "--shm-dir", "none"), env("SYNCMGR_AUTHKEY="+key, "XDG_RUNTIME_DIR="+home))
	t.Cleanup(d.stop)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	_, err := proxy.Dial(ctx, d.sock, d.keyBytes())
	if !errors.Is(err, proxy.ErrServerUID) {
		t.Fatalf("dial a socket of uid %d as root: %v, want ErrServerUID", attackerUID, err)
	}
	// proxy.WithServerUID (used by d.dial) is how root talks to a user's
	// daemon on purpose.
	call(t, d.dial(t), "ping", nil)
}
