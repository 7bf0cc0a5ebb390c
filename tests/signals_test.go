package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestSIGHUPStopsCleanlyAndRelativeSocketIsAbsolute (issue 12, item 14,
// daemon side): closing the terminal of `syncmgr serve &` (SIGHUP) is a
// clean stop, exit 0 with the socket removed; a relative --socket is made
// absolute, so the address the daemon reports works from any directory.
func TestSIGHUPStopsCleanlyAndRelativeSocketIsAbsolute(t *testing.T) {
	dir := shortDir(t)
	d := &daemon{t: t, sock: filepath.Join(dir, "rel.sock"), key: newKey(t)}
	cmd := []string{binPath, "serve", "--socket", "rel.sock", "--shm-dir", "none"}
	d.startArgvIn(dir, cmd, env("SYNCMGR_AUTHKEY="+d.key))
	t.Cleanup(d.stop)
	if !strings.Contains(d.stderr.String(), "socket="+d.sock) {
		t.Fatalf("the daemon does not report the absolute socket path %s:\n%s", d.sock, d.stderr)
	}
	call(t, d.dial(t), "ping", nil)
	code, _ := d.signal(syscall.SIGHUP)
	if code != 0 {
		t.Fatalf("SIGHUP: exit %d\n%s", code, d.stderr)
	}
	if _, err := os.Lstat(d.sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after SIGHUP: %v", err)
	}
}

// startArgvIn is startArgv with the daemon's working directory set.
func (d *daemon) startArgvIn(dir string, argv, environ []string) {
	d.t.Helper()
	orig := execCommand
	execCommand = func(name string, args ...string) *exec.Cmd {
		c := orig(name, args...)
		c.Dir = dir
		return c
	}
	defer func() { execCommand = orig }()
	d.startArgv(argv, environ)
}
