package tests

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syncmgr/syncmgr/proxy"
)

// infoFile is what `serve --info-file` writes.
type infoFile struct {
	PID       int    `json:"pid"`
	Socket    string `json:"socket"`
	TCP       string `json:"tcp"`
	TLSSHA256 string `json:"tls_sha256"`
	Run       string `json:"run"`
	Version   string `json:"version"`
}

// readInfo waits (bounded) for the daemon's info file and reads it,
// checking that it holds exactly the documented keys.
func readInfo(t *testing.T, path string) infoFile {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		body, err := os.ReadFile(path)
		if err == nil {
			var keys map[string]any
			must(t, json.Unmarshal(body, &keys))
			if len(keys) != 6 {
				t.Fatalf("info file keys: %v, want pid, socket, tcp, tls_sha256, run, version", keys)
			}
			var info infoFile
			must(t, json.Unmarshal(body, &info))
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("no info file at %s: %v", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pinned is a client TLS config that accepts exactly the certificate whose
// DER has SHA-256 fp (hex), as a program given the info file would build it.
func pinned(fp string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // the pin is the check
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no certificate")
			}
			sum := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if got := hex.EncodeToString(sum[:]); got != fp {
				return fmt.Errorf("certificate pin mismatch: got %s, want %s", got, fp)
			}
			return nil
		},
	}
}

// TestTLSSelfSignedInfoFile: `serve --tcp 127.0.0.1:0 --tls-self-signed
// --info-file F` writes F (mode 0600) with its pid, socket, the TCP port it
// bound, its certificate's fingerprint (also in its log) and its run id; a
// client pinning that fingerprint connects over TLS and works, one pinning
// another is stopped in the TLS handshake before the daemon sees any
// syncmgr handshake; after SIGTERM, F is gone.
func TestTLSSelfSignedInfoFile(t *testing.T) {
	path := filepath.Join(shortDir(t), "run", "info.json")
	must(t, os.Mkdir(filepath.Dir(path), 0o700))
	d := startDaemon(t, "--tcp", "127.0.0.1:0", "--tls-self-signed", "--info-file", path)
	info := readInfo(t, path)

	fi, err := os.Lstat(path)
	must(t, err)
	if fi.Mode() != 0o600 {
		t.Fatalf("info file mode %v, want 0600", fi.Mode())
	}
	if info.PID != d.cmd.Process.Pid || info.Socket != d.sock || info.Version == "" || len(info.Run) != 32 {
		t.Fatalf("info file %+v: pid want %d, socket want %s", info, d.cmd.Process.Pid, d.sock)
	}
	host, port, err := net.SplitHostPort(info.TCP)
	if err != nil || host != "127.0.0.1" || port == "0" || port == "" {
		t.Fatalf("info file tcp %q: want 127.0.0.1 and the port bound", info.TCP)
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(info.TLSSHA256) {
		t.Fatalf("info file tls_sha256 %q: want 64 lowercase hex digits", info.TLSSHA256)
	}
	if !strings.Contains(d.stderr.String(), "tls_sha256="+info.TLSSHA256) {
		t.Fatalf("the log does not give the fingerprint %s:\n%s", info.TLSSHA256, d.stderr)
	}
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*"))
	if len(leftovers) != 0 {
		t.Fatalf("temporary files left beside the info file: %v", leftovers)
	}

	addr := "tcp://" + info.TCP
	for name, opt := range map[string]proxy.Option{"VerifyConnection": proxy.WithTLS(pinned(info.TLSSHA256)), "WithTLSPin": proxy.WithTLSPin(info.TLSSHA256)} {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		c, err := proxy.Dial(ctx, addr, d.keyBytes(), opt)
		if err != nil {
			cancel()
			t.Fatalf("%s: pinned TLS dial: %v", name, err)
		}
		if got := c.Info().RunID; got != info.Run {
			t.Fatalf("%s: the daemon's run id is %s, the info file says %s", name, got, info.Run)
		}
		call(t, c, "create", obj("value", "v"+name, "typecode", "q", "value", int64(7)))
		if got := call(t, c, "get", obj("value", "v"+name)); got != int64(7) {
			t.Fatalf("%s: get over pinned TLS: %v", name, got)
		}
		c.Close()
		cancel()
	}

	// A wrong pin: the client stops in the TLS handshake; the daemon never
	// reads a syncmgr frame from it.
	wrong := strings.Repeat("ab", 32)
	for name, opt := range map[string]proxy.Option{"VerifyConnection": proxy.WithTLS(pinned(wrong)), "WithTLSPin": proxy.WithTLSPin(wrong)} {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		c, err := proxy.Dial(ctx, addr, d.keyBytes(), opt)
		cancel()
		if err == nil {
			c.Close()
			t.Fatalf("%s: a wrong pin connected", name)
		}
		if !strings.Contains(err.Error(), "tls handshake") || !strings.Contains(err.Error(), "pin") {
			t.Fatalf("%s: wrong pin: %v, want a TLS pin error", name, err)
		}
		if name == "WithTLSPin" && !errors.Is(err, proxy.ErrTLSPin) {
			t.Fatalf("WithTLSPin: %v, want proxy.ErrTLSPin", err)
		}
	}
	if log := d.stderr.String(); strings.Contains(log, "authentication failed") || strings.Contains(log, "auth frame") {
		t.Fatalf("the daemon saw a syncmgr handshake from a client with a wrong pin:\n%s", log)
	}

	if code, _ := d.signal(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code %d after SIGTERM\n%s", code, d.stderr)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the info file outlived the daemon: %v", err)
	}
}

// TestTLSSelfSignedOffLoopback: --tls-self-signed is TLS, so a --tcp
// address off loopback needs no --insecure; the info file gives the
// address bound.
func TestTLSSelfSignedOffLoopback(t *testing.T) {
	path := filepath.Join(shortDir(t), "info.json")
	d := startDaemon(t, "--tcp", "0.0.0.0:0", "--tls-self-signed", "--info-file", path)
	info := readInfo(t, path)
	host, port, err := net.SplitHostPort(info.TCP)
	if err != nil || (host != "0.0.0.0" && host != "::") || port == "0" { // Go listens on both families for 0.0.0.0
		t.Fatalf("info file tcp %q", info.TCP)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := proxy.Dial(ctx, "tcp://127.0.0.1:"+port, d.keyBytes(), proxy.WithTLSPin(info.TLSSHA256))
	if err != nil {
		t.Fatalf("pinned dial on the wildcard address: %v", err)
	}
	c.Close()
}

// TestTLSSelfSignedUsage: --tls-self-signed with --tls-cert or --tls-key,
// or without --tcp, is a usage error (exit 2) that names the flags; an
// info file path that is a symbolic link is refused (exit 1), its target
// untouched.
func TestTLSSelfSignedUsage(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "d.sock")
	environ := env("SYNCMGR_AUTHKEY=" + newKey(t))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tcp", "127.0.0.1:0", "--tls-self-signed", "--tls-cert", "c.pem"}, "--tls-self-signed and --tls-cert/--tls-key exclude each other"},
		{[]string{"--tcp", "127.0.0.1:0", "--tls-self-signed", "--tls-key", "k.pem"}, "--tls-self-signed and --tls-cert/--tls-key exclude each other"},
		{[]string{"--tls-self-signed"}, "--tls-self-signed needs --tcp"},
	} {
		args := append([]string{"serve", "--socket", sock, "--shm-dir", "none"}, tc.args...)
		_, stderr, code := runCmd(t, environ, args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Fatalf("%v: exit %d, %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}

	target := filepath.Join(dir, "target")
	must(t, os.WriteFile(target, []byte("keep"), 0o644))
	link := filepath.Join(dir, "info.json")
	must(t, os.Symlink(target, link))
	_, stderr, code := runCmd(t, environ, "serve", "--socket", sock, "--shm-dir", "none", "--tcp", "127.0.0.1:0", "--tls-self-signed", "--info-file", link)
	if code != 1 || !strings.Contains(stderr, "symbolic link") {
		t.Fatalf("info file on a symlink: exit %d, %q; want 1 and a refusal", code, stderr)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep" {
		t.Fatalf("the symlink's target was changed: %q %v", b, err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the symlink was replaced: %v %v", fi, err)
	}
}
