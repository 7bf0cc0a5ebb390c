package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
)

// The uids the multi-user tests run their processes as (see setpriv(1)).
const (
	victimUID   = 64001
	attackerUID = 64002
)

// needRoot skips a test that switches users when we are not root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the daemon and an attacker as two unprivileged uids with setpriv")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv(1) (util-linux) to switch users")
	}
}

// asUser returns argv run as uid (same gid, no supplementary groups).
func asUser(uid int, argv ...string) []string {
	id := fmt.Sprint(uid)
	return append([]string{"setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups", "--"}, argv...)
}

// sharedBin copies the binary where any user may run it.
func sharedBin(t *testing.T) string {
	t.Helper()
	dir := shortDir(t)
	must(t, os.Chmod(dir, 0o755))
	dst := filepath.Join(dir, "syncmgr")
	src, err := os.Open(binPath)
	must(t, err)
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE, 0o755)
	must(t, err)
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	must(t, out.Close())
	return dst
}

// shmDir returns a fresh directory in /dev/shm, mode 1777 like /dev/shm.
func shmDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "smt")
	if err != nil {
		t.Skipf("no /dev/shm to test with: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o1777))
	return dir
}

// kill SIGKILLs the daemon and waits for it.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	select {
	case <-d.exited:
	case <-time.After(bound):
		d.t.Fatal("daemon did not die")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func segPath(t *testing.T, c *proxy.Client, name string) string {
	t.Helper()
	info := call(t, c, "shm_attach", map[string]any{"name": name}).(map[string]any)
	return info["path"].(string)
}

// TestRefusedSecondServeKeepsSegments (issue 12, item 1): a second `serve`
// on a live daemon's socket is refused before it looks at shared memory,
// so the live daemon's segments survive it.
func TestRefusedSecondServeKeepsSegments(t *testing.T) {
	shm := shmDir(t)
	d := startDaemon(t, "--shm-dir", shm)
	c := d.dial(t)
	call(t, c, "shm_create", map[string]any{"name": "replay", "size": 4096})
	path := segPath(t, c, "replay")
	_, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+d.key), "serve", "--socket", d.sock, "--shm-dir", shm)
	if code == 0 || !strings.Contains(stderr, "already listening") {
		t.Fatalf("second serve: exit %d, %q", code, stderr)
	}
	if strings.Contains(stderr, "adopted") {
		t.Fatalf("the refused daemon looked at the live one's segments: %q", stderr)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the live daemon's segment file is gone: %v", err)
	}
	c2 := d.dial(t)
	if p := segPath(t, c2, "replay"); p != path {
		t.Fatalf("attach after the refused start: %s, want %s", p, path)
	}
}

// TestPlantedSegmentFilesAreNotAdopted (issue 12, item 2): another user
// plants files (a poisoned segment, a sparse 1 TiB file, a symlink) where a
// daemon's segments go, before the daemon restarts. The daemon adopts only
// its own segment, and its new segments are files of its own.
func TestPlantedSegmentFilesAreNotAdopted(t *testing.T) {
	needRoot(t)
	bin := sharedBin(t)
	shm := shmDir(t)
	home := shortDir(t)
	must(t, os.Chown(home, victimUID, victimUID))
	d := &daemon{t: t, sock: filepath.Join(home, "d.sock"), key: newKey(t), dialOpts: []proxy.Option{proxy.WithServerUID(victimUID)}}
	argv := asUser(victimUID, bin, "serve", "--socket", d.sock, "--shm-dir", shm, "--shm-limit", "64M", "--log-level", "debug")
	environ := env("SYNCMGR_AUTHKEY="+d.key, "XDG_RUNTIME_DIR="+home, "HOME="+home)
	d.startArgv(argv, environ)
	t.Cleanup(d.stop)
	c := d.dial(t)
	call(t, c, "shm_create", map[string]any{"name": "replay", "size": 4096})
	mine := segPath(t, c, "replay")
	c.Close()
	d.kill()

	// The attacker knows the socket path, hence the file names a daemon of
	// the previous release used, and sees the names in the directory.
	sum := sha256.Sum256([]byte(d.sock))
	old := filepath.Join(shm, "syncmgr-"+hex.EncodeToString(sum[:5])+"-")
	newStyle := filepath.Join(shm, "syncmgr-00112233aabbccdd-")
	script := strings.Join([]string{
		"umask 0", "set -e",
		"printf poison > " + old + "evil",
		"truncate -s 1T " + old + "big",
		"ln -s " + mine + " " + old + "link",
		"printf poison > " + newStyle + "evil",
		"truncate -s 1T " + newStyle + "big",
	}, "; ")
	plant := asUser(attackerUID, "sh", "-c", script)
	if out, err := exec.Command(plant[0], plant[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("plant files: %v\n%s", err, out)
	}

	d.startArgv(argv, environ)
	c = d.dial(t)
	list := call(t, c, "shm_list", nil).(map[string]any)
	segs := list["segments"].([]any)
	if len(segs) != 1 || segs[0].(map[string]any)["name"] != "replay" {
		t.Fatalf("segments after restart: %v (only the daemon's own 'replay' may be adopted)", segs)
	}
	if used := list["used"]; fmt.Sprint(used) != "4096" {
		t.Fatalf("shm usage %v counts planted files", used)
	}
	for _, name := range []string{"evil", "big", "link", "fresh"} {
		info, err := c.Call(context.Background(), "shm_create", map[string]any{"name": name, "size": 1 << 20}, nil)
		if err != nil {
			t.Fatalf("create %q after the plant: %v", name, err)
		}
		p := info.(map[string]any)["path"].(string)
		var st syscall.Stat_t
		must(t, syscall.Lstat(p, &st))
		if st.Uid != victimUID || st.Mode&0o7777 != 0o600 || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Size != 1<<20 {
			t.Fatalf("segment %q is %s: uid %d mode %o size %d, want the daemon's own 0600 file", name, p, st.Uid, st.Mode, st.Size)
		}
	}
	if b, _ := os.ReadFile(old + "evil"); string(b) != "poison" {
		t.Fatal("the planted file was written to")
	}
}

// TestDeadEmbeddedDaemonSegmentsAreRemoved (issue 12, item 9): the segments
// of an embedded daemon (--exit-with-parent) that was SIGKILLed are removed
// by the next daemon the user starts; those of a live one are not.
func TestDeadEmbeddedDaemonSegmentsAreRemoved(t *testing.T) {
	shm := shmDir(t)
	xdg := shortDir(t)
	embedded := func() (*daemon, string) {
		d := &daemon{t: t, sock: filepath.Join(shortDir(t), "e.sock"), key: newKey(t)}
		d.startArgv([]string{binPath, "serve", "--socket", d.sock, "--shm-dir", shm, "--exit-with-parent", fmt.Sprint(os.Getpid())},
			env("SYNCMGR_AUTHKEY="+d.key, "XDG_RUNTIME_DIR="+xdg))
		t.Cleanup(d.stop)
		c := d.dial(t)
		call(t, c, "shm_create", map[string]any{"name": "buf", "size": 4096})
		return d, segPath(t, c, "buf")
	}
	_, livePath := embedded()
	dead, deadPath := embedded()
	dead.kill()
	if _, err := os.Stat(deadPath); err != nil {
		t.Fatalf("no leaked file to test with: %v", err)
	}
	next := &daemon{t: t, sock: filepath.Join(shortDir(t), "n.sock"), key: newKey(t)}
	next.startArgv([]string{binPath, "serve", "--socket", next.sock, "--shm-dir", shm}, env("SYNCMGR_AUTHKEY="+next.key, "XDG_RUNTIME_DIR="+xdg))
	t.Cleanup(next.stop)
	if _, err := os.Stat(deadPath); !os.IsNotExist(err) {
		t.Fatalf("the dead embedded daemon's segment is still there: %v\n%s", err, next.stderr)
	}
	if _, err := os.Stat(livePath); err != nil {
		t.Fatalf("a live embedded daemon's segment was removed: %v", err)
	}
}
