package tests

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

func TestKeygenAndVersion(t *testing.T) {
	out1, _, code := runCmd(t, env(), "keygen")
	out2, _, _ := runCmd(t, env(), "keygen")
	if code != 0 || !regexp.MustCompile(`^[0-9a-f]{64}\n$`).MatchString(out1) || out1 == out2 {
		t.Fatalf("keygen: %q %q (exit %d)", out1, out2, code)
	}
	if _, stderr, code := runCmd(t, env(), "keygen", "extra"); code != 2 || !strings.Contains(stderr, `unexpected argument "extra"`) {
		t.Fatalf("keygen with an argument: exit %d, %q", code, stderr)
	}
	for _, arg := range []string{"version", "--version", "-v"} {
		if out, _, code := runCmd(t, env(), arg); code != 0 || out != "syncmgr 0.1.0\n" {
			t.Fatalf("%s: %q (exit %d)", arg, out, code)
		}
	}
	if out, _, code := runCmd(t, env(), "help"); code != 0 || !strings.Contains(out, "syncmgr serve") {
		t.Fatalf("help: %q (exit %d)", out, code)
	}
	if _, stderr, code := runCmd(t, env(), "frobnicate"); code != 2 || !strings.Contains(stderr, `unknown command "frobnicate"`) {
		t.Fatalf("unknown command: exit %d, %q", code, stderr)
	}
	if _, _, code := runCmd(t, env()); code != 2 {
		t.Fatalf("no command: exit %d", code)
	}
	// A key made by keygen works.
	key := strings.TrimSpace(out1)
	d := &daemon{t: t, sock: filepath.Join(shortDir(t), "k.sock"), key: key}
	d.start()
	t.Cleanup(d.stop)
	call(t, d.dial(t), "ping", nil)
}

func TestServeWithoutKey(t *testing.T) {
	sock := filepath.Join(shortDir(t), "n.sock")
	_, stderr, code := runCmd(t, env(), "serve", "--socket", sock, "--shm-dir", "none")
	if code != 2 || !strings.Contains(stderr, "SYNCMGR_AUTHKEY") || !strings.Contains(stderr, "syncmgr keygen") {
		t.Fatalf("exit %d, stderr %q: want a message saying how to make a key", code, stderr)
	}
	if _, err := os.Lstat(sock); err == nil {
		t.Fatal("the socket was created without a key")
	}
	// A key that is not hex is refused without echoing it.
	_, stderr, code = runCmd(t, env("SYNCMGR_AUTHKEY=not-hex-topsecret"), "serve", "--socket", sock, "--shm-dir", "none")
	if code == 0 || strings.Contains(stderr, "topsecret") || !strings.Contains(stderr, "hex") {
		t.Fatalf("bad key: exit %d, %q", code, stderr)
	}
	// Key files work, and so do their errors.
	dir := shortDir(t)
	keyFile := filepath.Join(dir, "key")
	os.WriteFile(keyFile, []byte(newKey(t)+"\n"), 0o600)
	d := &daemon{t: t, sock: filepath.Join(dir, "f.sock")}
	d.key, _ = readHex(keyFile)
	startWith(t, d, env(), "--authkey-file", keyFile)
	call(t, d.dial(t), "ping", nil)
	_, stderr, code = runCmd(t, env(), "serve", "--socket", filepath.Join(dir, "g.sock"), "--shm-dir", "none", "--authkey-file", filepath.Join(dir, "missing"))
	if code == 0 || !strings.Contains(stderr, "authkey file") {
		t.Fatalf("missing key file: exit %d, %q", code, stderr)
	}
	_, stderr, code = runCmd(t, env("SYNCMGR_AUTHKEY="+newKey(t)), "serve", "--socket", filepath.Join(dir, "h.sock"), "--shm-dir", "none", "--max-frame", "10")
	if code != 2 || !strings.Contains(stderr, "--max-frame") {
		t.Fatalf("bad --max-frame: exit %d, %q", code, stderr)
	}
	for _, bad := range []string{"1000", "32768", "3145728", "2147483648"} {
		_, stderr, code = runCmd(t, env("SYNCMGR_AUTHKEY="+newKey(t)), "serve", "--socket", filepath.Join(dir, "i.sock"), "--shm-dir", "none", "--queue-ring-bytes", bad)
		if code != 2 || !strings.Contains(stderr, "--queue-ring-bytes") {
			t.Fatalf("bad --queue-ring-bytes %s: exit %d, %q", bad, code, stderr)
		}
	}
}

func readHex(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

// startWith starts d with a given environment (for key-file tests).
func startWith(t *testing.T, d *daemon, environ []string, flags ...string) {
	t.Helper()
	args := append([]string{"serve", "--socket", d.sock, "--shm-dir", "none"}, flags...)
	d.cmd = exec.Command(binPath, args...)
	d.cmd.Env = environ
	d.stderr = &syncBuffer{}
	d.cmd.Stdout, d.cmd.Stderr = d.stderr, d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.exited = make(chan struct{})
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(d.stop)
	deadline := time.Now().Add(bound)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := proxy.Dial(ctx, d.sock, d.keyBytes())
		cancel()
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon not answering: %v\n%s", err, d.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSocketPermissions(t *testing.T) {
	base := shortDir(t)
	d := &daemon{t: t, sock: filepath.Join(base, "sub", "p.sock"), key: newKey(t)}
	d.start()
	t.Cleanup(d.stop)
	fi, err := os.Lstat(d.sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a 0600 socket", fi.Mode())
	}
	di, err := os.Stat(filepath.Dir(d.sock))
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o700 {
		t.Fatalf("socket dir mode %v, want 0700", di.Mode().Perm())
	}
}

func TestSecondServeAndStaleSocket(t *testing.T) {
	d := startDaemon(t)
	c := d.dial(t)
	call(t, c, "create", obj("value", "v", "typecode", "i", "value", 7))
	// A second daemon on a live socket fails clearly and leaves it alone.
	_, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+d.key), "serve", "--socket", d.sock, "--shm-dir", "none")
	if code == 0 || !strings.Contains(stderr, "already listening") {
		t.Fatalf("second serve: exit %d, %q", code, stderr)
	}
	if got := call(t, c, "get", obj("value", "v")); got != int64(7) {
		t.Fatalf("the first daemon lost its value: %v", got)
	}
	call(t, d.dial(t), "ping", nil) // and still accepts connections

	// A stale socket file (nothing listening) is replaced.
	stale := filepath.Join(shortDir(t), "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(stale); err != nil {
		t.Fatal("no stale socket file to test with")
	}
	d2 := &daemon{t: t, sock: stale, key: newKey(t)}
	d2.start()
	t.Cleanup(d2.stop)
	call(t, d2.dial(t), "ping", nil)

	// A path that exists and is not a socket is never removed.
	file := filepath.Join(shortDir(t), "file.sock")
	os.WriteFile(file, []byte("data"), 0o600)
	_, stderr, code = runCmd(t, env("SYNCMGR_AUTHKEY="+d.key), "serve", "--socket", file, "--shm-dir", "none")
	if code == 0 || !strings.Contains(stderr, "not a socket") {
		t.Fatalf("serve on a regular file: exit %d, %q", code, stderr)
	}
	if b, _ := os.ReadFile(file); string(b) != "data" {
		t.Fatal("the regular file was touched")
	}
}

func TestSIGTERMWithBlockedClient(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			d := startDaemon(t, "--handshake-timeout", "1m")
			holder, waiter := d.dial(t), d.dial(t)
			call(t, holder, "create", obj("lock", "L"))
			call(t, holder, "acquire", obj("lock", "L"))
			call(t, holder, "create", obj("queue", "Q"))
			errc := make(chan error, 2)
			go func() { errc <- callErr(waiter, "acquire", obj("lock", "L", "tid", 2)) }()
			go func() { errc <- callErr(waiter, "get", obj("queue", "Q")) }()
			waitWaiting(t, holder, 2)
			d.connect(t) // a client stuck in the handshake does not delay the exit

			exit, took := d.signal(sig)
			if exit != 0 {
				t.Fatalf("exit code %d\n%s", exit, d.stderr)
			}
			if took > 3*time.Second {
				t.Fatalf("took %v to exit", took)
			}
			for i := 0; i < 2; i++ {
				select {
				case err := <-errc:
					if code(err) != wire.CodeShutdown {
						t.Fatalf("blocked client got %v, want shutting_down", err)
					}
				case <-time.After(bound):
					t.Fatal("blocked client not answered")
				}
			}
			if _, err := os.Lstat(d.sock); err == nil {
				t.Fatal("the socket file was left behind")
			}
			if !strings.Contains(d.stderr.String(), "stopped") {
				t.Fatalf("no clean stop in the log:\n%s", d.stderr)
			}
		})
	}
}

// waitWaiting waits until the status listing shows n waiters in total.
func waitWaiting(t *testing.T, c *proxy.Client, n int64) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		st := call(t, c, "status", nil).(map[string]any)
		var w int64
		for _, o := range st["objects"].([]any) {
			w += o.(map[string]any)["waiters"].(int64)
		}
		if w == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", w, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKeyNeverLeaks(t *testing.T) {
	d := startDaemon(t)
	c := d.dial(t)
	call(t, c, "create", obj("lock", "L"))
	// Failed handshakes of every sort, which the daemon logs.
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if _, err := proxy.Dial(ctx, d.sock, []byte("wrong key")); err == nil {
		t.Fatal("wrong key accepted")
	}
	r := d.connect(t)
	r.frame()
	wire.WriteFrame(r.nc, []byte{0xc1})
	r.closed(bound)
	bad := d.raw(t)
	bad.write([]byte{0, 0, 0, 3, 1, 2, 3})
	bad.closed(bound)

	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(d.cmd.Process.Pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	statusOut, _, _ := runCmd(t, env("SYNCMGR_AUTHKEY="+d.key), "status", "--address", d.sock)
	d.signal(syscall.SIGTERM)

	raw := d.keyBytes()
	haystacks := map[string][]byte{"log": []byte(d.stderr.String()), "cmdline": cmdline, "status output": []byte(statusOut)}
	for name, h := range haystacks {
		for _, needle := range [][]byte{[]byte(d.key), []byte(strings.ToUpper(d.key)), raw, []byte(hex.EncodeToString(raw[:8]))} {
			if bytes.Contains(h, needle) {
				t.Fatalf("the key appears in the %s", name)
			}
		}
	}
	if !strings.Contains(d.stderr.String(), "authentication failed") {
		t.Fatalf("the failed handshake was not logged (so this test checks little):\n%s", d.stderr)
	}
}

func TestStatusCommand(t *testing.T) {
	d := startDaemon(t)
	c := d.dial(t, proxy.WithLabel("worker-7"))
	call(t, c, "create", obj("lock", "ingest"))
	call(t, c, "acquire", obj("lock", "ingest", "tid", 140))
	call(t, c, "create", obj("queue", "jobs"))
	call(t, c, "put", obj("queue", "jobs", "item", []byte("x")))
	call(t, c, "create", obj("event", "ready"))
	out, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+d.key), "status", "--address", d.sock)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"syncmgr 0.1.0", "KIND", "NAME", "lock", "ingest", "locked by session", "thread 140",
		"queue", "jobs", "1 items", "event", "ready", "clear", "SESSION", "worker-7", "syncmgr status"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	// Without a key it says how to give one; with the wrong one it fails.
	if _, stderr, code := runCmd(t, env(), "status", "--address", d.sock); code != 2 || !strings.Contains(stderr, "SYNCMGR_AUTHKEY") {
		t.Fatalf("status without a key: exit %d, %q", code, stderr)
	}
	if _, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+newKey(t)), "status", "--address", d.sock); code != 1 || !strings.Contains(stderr, "authentication failed") {
		t.Fatalf("status with a wrong key: exit %d, %q", code, stderr)
	}
	// SYNCMGR_ADDRESS is the default address.
	if out, _, code := runCmd(t, env("SYNCMGR_AUTHKEY="+d.key, "SYNCMGR_ADDRESS="+d.sock), "status"); code != 0 || !strings.Contains(out, "ingest") {
		t.Fatalf("status via SYNCMGR_ADDRESS: exit %d\n%s", code, out)
	}
}
