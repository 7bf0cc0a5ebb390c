// Package tests runs the real syncmgr binary: it is built once per test run
// (with the race detector when the tests have it) and driven over its Unix
// socket by the Go client and by hand-made, hostile frames.
package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/proxy"
	"github.com/syncmgr/syncmgr/wire"
)

// bound is the longest any single wait in these tests may take.
const bound = 10 * time.Second

// binPath is the syncmgr binary built by TestMain: with the race detector
// when the tests run under it, so that the daemon's races fail them too.
// plainBinPath is built without it, for the tests that bound the daemon's
// memory (the race detector multiplies it) or time its work.
var binPath, plainBinPath string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv("SYNCMGR_TEST_DIAL") != "" { // a helper process (otherusers_test.go): no daemon to build
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "syncmgr-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "syncmgr")
	plainBinPath = binPath
	if raceEnabled {
		plainBinPath = filepath.Join(dir, "syncmgr-plain")
		if err := buildDaemon(plainBinPath); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if err := buildDaemon(binPath, raceFlag()...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func raceFlag() []string {
	if raceEnabled {
		return []string{"-race"}
	}
	return nil
}

// buildDaemon builds cmd/syncmgr into path.
func buildDaemon(path string, flags ...string) error {
	args := append(append([]string{"build", "-o", path}, flags...), "github.com/syncmgr/syncmgr/cmd/syncmgr")
	cmd := exec.Command("go", args...) // go test puts its own go first on PATH
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build syncmgr: %v\n%s", err, out)
	}
	return nil
}

// syncBuffer is a bytes.Buffer safe for a process to write while a test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newKey(t *testing.T) string {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(k)
}

// shortDir returns a temp dir with a short path (socket paths are limited
// to about 100 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "smi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// env is the environment for the binary: ours without any SYNCMGR_ vars,
// plus extra. The race runtime's default 1 s sleep at exit is turned off.
func env(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SYNCMGR_") && !strings.HasPrefix(kv, "GORACE=") {
			out = append(out, kv)
		}
	}
	out = append(out, "GORACE=atexit_sleep_ms=0")
	return append(out, extra...)
}

// runCmd runs the binary to completion and returns stdout, stderr and the
// exit code.
func runCmd(t *testing.T, environ []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = environ
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("%v did not finish in %v", args, bound)
	}
	return o.String(), e.String(), code
}

// daemon is a running `syncmgr serve`.
type daemon struct {
	t      *testing.T
	cmd    *exec.Cmd
	sock   string
	key    string // hex
	stderr *syncBuffer
	exited chan struct{}
	err    error // from Wait, valid once exited is closed

	dialOpts []proxy.Option // for daemons run as another user (proxy.WithServerUID)
	bin      string         // the binary start runs: binPath unless set
}

// startDaemon runs `syncmgr serve` on a fresh socket with extra flags and
// waits until it answers.
func startDaemon(t *testing.T, flags ...string) *daemon {
	t.Helper()
	return startDaemonBin(t, binPath, flags...)
}

// startPlainDaemon is startDaemon with the daemon built without the race
// detector (plainBinPath).
func startPlainDaemon(t *testing.T, flags ...string) *daemon {
	t.Helper()
	return startDaemonBin(t, plainBinPath, flags...)
}

func startDaemonBin(t *testing.T, bin string, flags ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, sock: filepath.Join(shortDir(t), "d.sock"), key: newKey(t), bin: bin}
	d.start(flags...)
	t.Cleanup(d.stop)
	return d
}

func (d *daemon) start(flags ...string) {
	d.t.Helper()
	bin := d.bin
	if bin == "" {
		bin = binPath
	}
	args := append([]string{bin, "serve", "--socket", d.sock, "--shm-dir", "none", "--log-level", "debug"}, flags...)
	d.startArgv(args, env("SYNCMGR_AUTHKEY="+d.key))
}

// execCommand makes the daemon's command (tests may set its directory).
var execCommand = exec.Command

// startArgv starts a daemon from a full argv and environment; d.sock and
// d.key must be set. It waits until the daemon answers.
func (d *daemon) startArgv(argv, environ []string) {
	d.t.Helper()
	d.cmd = execCommand(argv[0], argv[1:]...)
	d.cmd.Env = environ
	d.stderr = &syncBuffer{}
	d.cmd.Stdout, d.cmd.Stderr = d.stderr, d.stderr
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.exited = make(chan struct{})
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(bound)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := proxy.Dial(ctx, d.sock, d.keyBytes(), d.dialOpts...)
		cancel()
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-d.exited:
			d.t.Fatalf("daemon exited at start: %v\n%s", d.err, d.stderr)
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("daemon not answering: %v\n%s", err, d.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *daemon) keyBytes() []byte {
	k, _ := hex.DecodeString(d.key)
	return k
}

// signal sends sig and waits (bounded) for the daemon to exit; it returns
// the exit code and how long the exit took.
func (d *daemon) signal(sig syscall.Signal) (int, time.Duration) {
	d.t.Helper()
	start := time.Now()
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.exited:
	case <-time.After(bound):
		_ = d.cmd.Process.Kill()
		<-d.exited
		d.t.Fatalf("daemon did not exit %v after %v\n%s", bound, sig, d.stderr)
	}
	return d.cmd.ProcessState.ExitCode(), time.Since(start)
}

// stop ends the daemon if it still runs and checks its log for races.
func (d *daemon) stop() {
	select {
	case <-d.exited:
	default:
		d.signal(syscall.SIGTERM)
	}
	if log := d.stderr.String(); strings.Contains(log, "DATA RACE") || strings.Contains(log, "panic:") {
		d.t.Errorf("daemon log shows a race or panic:\n%s", log)
	}
}

func (d *daemon) dial(t *testing.T, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := proxy.Dial(ctx, d.sock, d.keyBytes(), append(d.dialOpts, opts...)...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawConn speaks the protocol by hand.
type rawConn struct {
	t  *testing.T
	nc net.Conn
}

// connect opens a connection without a handshake.
func (d *daemon) connect(t *testing.T) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("unix", d.sock, bound)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc}
}

// raw opens a connection and completes the handshake.
func (d *daemon) raw(t *testing.T) *rawConn {
	t.Helper()
	r := d.connect(t)
	_ = r.nc.SetDeadline(time.Now().Add(bound))
	if _, err := auth.Client(r.nc, auth.ClientConfig{Key: d.keyBytes(), Label: "raw"}); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	_ = r.nc.SetDeadline(time.Time{})
	return r
}

func (r *rawConn) write(b []byte) {
	r.t.Helper()
	_ = r.nc.SetWriteDeadline(time.Now().Add(bound))
	if _, err := r.nc.Write(b); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

func (r *rawConn) send(id uint64, op string, args map[string]any) {
	r.t.Helper()
	frame, err := wire.EncodeRequest(id, op, args)
	if err != nil {
		r.t.Fatal(err)
	}
	r.write(frame)
}

func (r *rawConn) frame() ([]byte, error) {
	_ = r.nc.SetReadDeadline(time.Now().Add(bound))
	return wire.ReadFrame(r.nc, wire.DefaultMaxFrame)
}

func (r *rawConn) recv() wire.Reply {
	r.t.Helper()
	body, err := r.frame()
	if err != nil {
		r.t.Fatalf("read reply: %v", err)
	}
	rep, err := wire.DecodeReply(body)
	if err != nil {
		r.t.Fatalf("decode reply: %v", err)
	}
	return rep
}

// handshakeError reads an error frame of the handshake and returns its code.
func (r *rawConn) handshakeError() string {
	r.t.Helper()
	body, err := r.frame()
	if err != nil {
		r.t.Fatalf("read: %v", err)
	}
	var em auth.ErrorMsg
	if err := wire.Unmarshal(body, &em); err != nil || em.T != "error" {
		r.t.Fatalf("expected an error frame, got %q (%v)", body, err)
	}
	return em.Code
}

// closed checks that the daemon closes the connection within d and
// returns how long that took.
func (r *rawConn) closed(within time.Duration) time.Duration {
	r.t.Helper()
	start := time.Now()
	_ = r.nc.SetReadDeadline(start.Add(within))
	buf := make([]byte, 4096)
	for {
		_, err := r.nc.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			r.t.Fatalf("connection still open after %v", within)
		}
		return time.Since(start)
	}
}

func code(err error) wire.Code {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code
	}
	return ""
}

func obj(kind, name string, kv ...any) map[string]any {
	m := map[string]any{"kind": kind, "name": name}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func call(t *testing.T, c *proxy.Client, op string, args map[string]any) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	res, err := c.Call(ctx, op, args, nil)
	if err != nil {
		t.Fatalf("%s %v: %v", op, args, err)
	}
	return res
}

func callErr(c *proxy.Client, op string, args map[string]any) error {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	_, err := c.Call(ctx, op, args, nil)
	return err
}
