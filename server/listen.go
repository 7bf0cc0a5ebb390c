package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/syncmgr/syncmgr/auth"
	"github.com/syncmgr/syncmgr/internal/fsafe"
	"github.com/syncmgr/syncmgr/wire"
)

// DefaultSocketPath returns $XDG_RUNTIME_DIR/syncmgr.sock, or
// $TMPDIR/syncmgr-<uid>/syncmgr.sock (TMPDIR defaulting to /tmp) when
// XDG_RUNTIME_DIR is not set.
func DefaultSocketPath() string {
	return filepath.Join(UserDir(), "syncmgr.sock")
}

// UserDir returns the directory private to this user where syncmgr keeps
// its default socket and its run records: $XDG_RUNTIME_DIR, else
// $TMPDIR/syncmgr-<uid>.
func UserDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("syncmgr-%d", os.Getuid()))
}

// ErrInUse is returned by ListenUnix when a live server holds the socket.
var ErrInUse = errors.New("a server is already listening on this socket")

// UnixOptions widen who may connect to a Unix socket (--allow-other-users).
// The zero value (and ListenUnix) is private: socket 0600.
type UnixOptions struct {
	// Group, when > 0, gives this group read and write on the socket (0660)
	// and search on a directory the listener creates (0710).
	Group int
	// World gives everyone read and write on the socket (0666) and search
	// on a directory the listener creates (0711). Ignored when Group is set.
	World bool
}

// unixListener holds the socket's lock file for as long as it listens.
type unixListener struct {
	*net.UnixListener
	lock *fsafe.Lock
}

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.lock.Release(true)
	return err
}

// ListenUnix listens on a private Unix socket at path; see ListenUnixWith.
func ListenUnix(path string) (net.Listener, error) {
	return ListenUnixWith(path, UnixOptions{})
}

// ListenUnixWith listens on a Unix socket at path.
//
// The directory is created 0700 when missing; an existing one must belong
// to us and not be writable by group or others (another user could replace
// the socket there). The listener first takes an exclusive lock on
// path+".lock", held until it is closed: a second daemon on the same path
// fails with ErrInUse before it touches anything. A socket file left by a
// dead daemon is replaced only if it is a socket that nothing answers on. The
// socket file is 0600 (wider with opts) and is removed when the listener is
// closed. A relative path is made absolute.
func ListenUnixWith(path string, opts UnixOptions) (net.Listener, error) {
	path, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("socket path: %w", err)
	}
	dir := filepath.Dir(path)
	if err := ensurePrivateDir(dir, opts); err != nil {
		return nil, err
	}
	lock, err := fsafe.TryLock(path + ".lock")
	if errors.Is(err, fsafe.ErrLocked) {
		return nil, fmt.Errorf("listen on %s: %w", path, ErrInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln, err := listenLocked(path, opts)
	if err != nil {
		lock.Release(false)
		return nil, err
	}
	return &unixListener{UnixListener: ln, lock: lock}, nil
}

func listenLocked(path string, opts UnixOptions) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("listen on %s: the path exists and is not a socket", path)
		}
		// A server that does not take the lock (an older syncmgr) may
		// still answer here.
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
	mode := os.FileMode(0o600)
	switch {
	case opts.Group > 0:
		if err := os.Lchown(path, -1, opts.Group); err != nil {
			ln.Close()
			return nil, fmt.Errorf("give the socket to group %d: %w", opts.Group, err)
		}
		mode = 0o660
	case opts.World:
		mode = 0o666
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	return ln, nil
}

// ensurePrivateDir creates dir 0700 (0710 or 0711 with opts, so that the
// allowed users can reach the socket but not list or change the directory),
// or checks that an existing one is a real directory owned by us that group
// and others cannot write.
func ensurePrivateDir(dir string, opts UnixOptions) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create socket directory: %w", err)
		}
		switch {
		case opts.Group > 0:
			if err := os.Lchown(dir, -1, opts.Group); err != nil {
				return fmt.Errorf("give the socket directory to group %d: %w", opts.Group, err)
			}
			if err := os.Chmod(dir, 0o710); err != nil {
				return fmt.Errorf("chmod socket directory: %w", err)
			}
		case opts.World:
			if err := os.Chmod(dir, 0o711); err != nil {
				return fmt.Errorf("chmod socket directory: %w", err)
			}
		}
	}
	if err := fsafe.CheckDir(dir); err != nil {
		return fmt.Errorf("socket directory refused: %w (use a directory of your own, e.g. unset --socket to get %s)", err, DefaultSocketPath())
	}
	return nil
}

// ListenTCP listens on a TCP address, wrapped in TLS when cfg is not nil.
// On a TLS port, a peer whose first bytes are not a TLS handshake record
// (a plaintext syncmgr client's ready frame), or that has sent nothing
// after TLSSilence (an older plaintext client waiting for the server's
// hello), is told in a plaintext handshake error frame that the port needs
// TLS, instead of a TLS alert or a silent timeout.
func ListenTCP(addr string, cfg *tls.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on tcp: %w", err)
	}
	if cfg != nil {
		return tls.NewListener(sniffListener{ln}, cfg), nil
	}
	return ln, nil
}

// TLSSilence is how long a TLS port waits for a client's first byte before
// answering as to a plaintext client. TLS clients send their hello at once.
var TLSSilence = 1500 * time.Millisecond

type sniffListener struct{ net.Listener }

func (l sniffListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: c, raw: newRawIO(c)}, nil
}

// sniffConn answers a silent peer with a plaintext error frame on its first
// read (which the TLS server makes to get the client's hello).
//
// After that first read, its records are read and written by raw system
// calls (rawIO), as a plain connection's frames are: crypto/tls reads a
// 1 MiB item as some 64 records, and a read through the runtime's ordinary
// system call path woke its monitor thread, a context switch, for many of
// them.
type sniffConn struct {
	net.Conn
	raw *rawIO // nil: the plain net.Conn's methods
	// loop: the connection is in an event loop (evloop_tls.go); set
	// under conn.wmu before the loop first reads.
	loop   *loopState
	first  bool
	readDL time.Time   // the read deadline the TLS server asked for
	spoke  atomic.Bool // the peer has sent bytes (its TLS handshake): see admission
}

func (c *sniffConn) SetDeadline(t time.Time) error {
	c.readDL = t
	return c.Conn.SetDeadline(t)
}

func (c *sniffConn) SetReadDeadline(t time.Time) error {
	c.readDL = t
	return c.Conn.SetReadDeadline(t)
}

func (c *sniffConn) Write(b []byte) (int, error) {
	if c.loop != nil {
		c.loop.keep(b)
		return len(b), nil
	}
	if c.raw == nil {
		return c.Conn.Write(b)
	}
	if err := c.raw.writeBuffers([][]byte{b}); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (c *sniffConn) Read(b []byte) (int, error) {
	if c.loop != nil {
		return c.loop.read(b)
	}
	if c.first {
		var n int
		var err error
		if c.raw != nil {
			n, err = c.raw.Read(b)
		} else {
			n, err = c.Conn.Read(b)
		}
		if n > 0 {
			c.spoke.Store(true)
		}
		return n, err
	}
	c.first = true
	dl := time.Now().Add(TLSSilence)
	if !c.readDL.IsZero() && c.readDL.Before(dl) {
		dl = c.readDL
	}
	_ = c.Conn.SetReadDeadline(dl)
	n, err := c.Conn.Read(b)
	_ = c.Conn.SetReadDeadline(c.readDL)
	var ne net.Error
	switch {
	case n == 0 && err != nil && errors.As(err, &ne) && ne.Timeout(), // silent: an older client waiting for the hello
		n > 0 && b[0] != tlsHandshakeRecord: // a syncmgr frame (the client's ready), not a TLS ClientHello
		if frame, merr := wire.Marshal(auth.ErrorMsg{T: "error", Code: string(wire.CodeBadRequest),
			Message: "this port requires TLS: the client connected without it (give the client the CA: $SYNCMGR_TLS_CA, or its TLS options)"}); merr == nil {
			_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
			_ = wire.WriteFrame(c.Conn, frame)
		}
		return 0, errors.New("a plaintext client on a TLS port")
	}
	if n > 0 {
		c.spoke.Store(true)
	}
	return n, err
}

// tlsHandshakeRecord is the first byte of a TLS client's first record.
const tlsHandshakeRecord = 0x16

// tlsHeld bounds what crypto/tls may hold of a frame's body once the
// frame's header has been read, so the socket will surely still deliver
// the body less this (rawIO.expect). All crypto/tls holds is in one buffer
// (its rawInput): the plaintext of the record it is handing out, decrypted
// in place, and the bytes it has read past that record. It reads the
// socket only to complete a record, so with less than one record (16 KiB
// and 261 bytes) unread and at most that plus 512 bytes asked for; the
// buffer grows (doubling) only while that is more than half of it, so it
// never grows past twice 68 KiB, and holds no more. Measured, a 1 MiB
// frame's first read left 10-26 KiB of its body there.
// TestTLSHoldsNoMoreThanTlsHeld checks the bound against the crypto/tls in
// use.
const tlsHeld = 160 << 10

// tlsRecords is the raw reader below a TLS connection's records, or nil.
func tlsRecords(nc net.Conn) *rawIO {
	tc, ok := nc.(*tls.Conn)
	if !ok {
		return nil
	}
	sc, ok := tc.NetConn().(*sniffConn)
	if !ok {
		return nil
	}
	return sc.raw
}
