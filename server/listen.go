package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// DefaultSocketPath returns $XDG_RUNTIME_DIR/syncmgr.sock, or
// /tmp/syncmgr-<uid>/syncmgr.sock when XDG_RUNTIME_DIR is not set.
func DefaultSocketPath() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "syncmgr.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("syncmgr-%d", os.Getuid()), "syncmgr.sock")
}

// ErrInUse is returned by ListenUnix when a live server answers on the path.
var ErrInUse = errors.New("a server is already listening on this socket")

// ListenUnix listens on a Unix socket at path. The directory is created 0700
// when missing (and must then belong to us); a stale socket file is removed
// only if it is a socket that nothing answers on. The socket file is 0600 and
// is removed when the listener is closed.
func ListenUnix(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := ensurePrivateDir(dir); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("listen on %s: the path exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen on %s: %w", path, ErrInUse)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	old := syscall.Umask(0o177) // the socket is born 0600: no window for others
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on unix socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	return ln, nil
}

// ensurePrivateDir creates dir 0700, or checks that an existing one is a
// real directory owned by us and not writable by others.
func ensurePrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create socket directory: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat socket directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("socket directory %s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() && fi.Mode()&0o002 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("socket directory %s is writable by others and not ours", dir)
	}
	return nil
}

// ListenTCP listens on a TCP address, wrapped in TLS when cfg is not nil.
func ListenTCP(addr string, cfg *tls.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on tcp: %w", err)
	}
	if cfg != nil {
		return tls.NewListener(ln, cfg), nil
	}
	return ln, nil
}
