package tests

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/syncmgr/syncmgr/proxy"
)

// The helper process of TestAllowOtherUsers: dials SYNCMGR_TEST_DIAL as
// whatever user it was started as, accepting a server of uid
// SYNCMGR_TEST_SERVER_UID, and prints "ok" or the error.
func TestHelperDialAsAnotherUser(t *testing.T) {
	addr := os.Getenv("SYNCMGR_TEST_DIAL")
	if addr == "" {
		t.Skip("helper process only")
	}
	uid, _ := strconv.Atoi(os.Getenv("SYNCMGR_TEST_SERVER_UID"))
	key, _ := hexKey(os.Getenv("SYNCMGR_TEST_KEY"))
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := proxy.Dial(ctx, addr, key, proxy.WithServerUID(uid))
	if err == nil {
		defer c.Close()
		_, err = c.Call(ctx, "ping", nil, nil)
	}
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	// The daemon's memory (state segment, Queue rings) is for its own user
	// only, whatever lets another user connect.
	if _, err := c.Call(ctx, "fastpath_attach", nil, nil); err == nil {
		fmt.Println("fastpath granted")
		return
	}
	q := map[string]any{"kind": "queue", "name": "q"}
	if _, err := c.Call(ctx, "create", q, nil); err != nil {
		fmt.Println("dial: create a queue:", err)
		return
	}
	if _, err := c.Call(ctx, "queue_attach", q, nil); err == nil {
		fmt.Println("queue ring granted")
		return
	}
	fmt.Println("ok")
}

func hexKey(s string) ([]byte, error) {
	d := &daemon{key: s}
	return d.keyBytes(), nil
}

// TestAllowOtherUsers (issue 12, item 13): --allow-other-users lets another
// user's process (with the key) connect: the socket becomes 0666 in a
// directory others may search but not list; with --socket-group only that
// group's members can connect (socket 0660). Without the flag they cannot.
func TestAllowOtherUsers(t *testing.T) {
	needRoot(t)
	const group = 64003
	bin := sharedBin(t)
	// The test binary, where the other user can run it.
	helper := filepath.Join(filepath.Dir(bin), "tests.test")
	copyFile(t, os.Args[0], helper)

	base := shortDir(t)
	must(t, os.Chmod(base, 0o755))
	home := filepath.Join(base, "v")
	must(t, os.Mkdir(home, 0o755))
	must(t, os.Chown(home, victimUID, victimUID))

	dialAs := func(sock, key string, groups string) string {
		argv := []string{"setpriv", "--reuid=" + fmt.Sprint(attackerUID), "--regid=" + fmt.Sprint(attackerUID)}
		if groups == "" {
			argv = append(argv, "--clear-groups")
		} else {
			argv = append(argv, "--groups="+groups)
		}
		argv = append(argv, "--", helper, "-test.run=^TestHelperDialAsAnotherUser$", "-test.v")
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = env("SYNCMGR_TEST_DIAL="+sock, "SYNCMGR_TEST_KEY="+key, "SYNCMGR_TEST_SERVER_UID="+fmt.Sprint(victimUID))
		out, _ := cmd.CombinedOutput()
		for _, line := range strings.Split(string(out), "\n") {
			if line == "ok" || strings.HasPrefix(line, "dial:") || strings.HasSuffix(line, " granted") {
				return line
			}
		}
		return "helper failed: " + string(out)
	}
	start := func(name string, groups string, flags ...string) *daemon {
		d := &daemon{t: t, sock: filepath.Join(home, name, "s.sock"), key: newKey(t), dialOpts: []proxy.Option{proxy.WithServerUID(victimUID)}}
		argv := []string{"setpriv", "--reuid=" + fmt.Sprint(victimUID), "--regid=" + fmt.Sprint(victimUID)}
		if groups == "" {
			argv = append(argv, "--clear-groups")
		} else {
			argv = append(argv, "--groups="+groups)
		}
		argv = append(argv, "--", bin, "serve", "--socket", d.sock, "--shm-dir", "none")
		d.startArgv(append(argv, flags...), env("SYNCMGR_AUTHKEY="+d.key, "XDG_RUNTIME_DIR="+home))
		t.Cleanup(d.stop)
		return d
	}

	private := start("private", "")
	if got := dialAs(private.sock, private.key, ""); got == "ok" {
		t.Fatal("another user connected without --allow-other-users")
	}
	world := start("world", "", "--allow-other-users")
	if got := dialAs(world.sock, world.key, ""); got != "ok" {
		t.Fatalf("--allow-other-users: another user could not connect: %s\n%s", got, world.stderr)
	}
	grouped := start("grouped", fmt.Sprint(group), "--allow-other-users", "--socket-group", fmt.Sprint(group))
	if got := dialAs(grouped.sock, grouped.key, fmt.Sprint(group)); got != "ok" {
		t.Fatalf("--socket-group: a member could not connect: %s\n%s", got, grouped.stderr)
	}
	if got := dialAs(grouped.sock, grouped.key, ""); got == "ok" {
		t.Fatal("--socket-group: a user outside the group connected")
	}
	wrong := []byte(world.key)
	wrong[0] = "10"[boolInt(wrong[0] == '1')]
	if got := dialAs(world.sock, string(wrong), ""); got == "ok" {
		t.Fatal("--allow-other-users let in a wrong key")
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	must(t, err)
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	must(t, err)
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	must(t, out.Close())
}
