package server

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawIO reads and writes a plain Unix or TCP socket with raw system calls
// on its non-blocking descriptor, waiting through the runtime's poller
// (syscall.RawConn) only when the socket is not ready. A request is a read
// and its reply a write that never block, and the runtime's bookkeeping
// around an ordinary system call (entersyscall, which also wakes the
// runtime's monitor thread each time it has gone to sleep on an idle
// daemon) cost more than the call itself. Deadlines set on the connection
// still apply: RawConn waits with them.
type rawIO struct {
	rc  syscall.RawConn
	tcp bool // a TCP socket, whose wake-ups SO_RCVLOWAT defers (expect)
	// need is how many more bytes the socket will surely deliver (the
	// rest of a large frame's body: expect), and lowat the socket's
	// SO_RCVLOWAT as last set (0: never set, the kernel's 1).
	need, lowat int
}

// newRawIO returns nc's raw reader and writer, or nil for a connection
// that is not a plain socket (TLS: its records need crypto/tls).
func newRawIO(nc net.Conn) *rawIO {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	var tcp bool
	switch nc.(type) {
	case *net.UnixConn:
	case *net.TCPConn:
		tcp = true
	default:
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return &rawIO{rc: rc, tcp: tcp}
}

// Read implements io.Reader.
func (r *rawIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var rerr error
	err := r.rc.Read(func(fd uintptr) bool {
		n, rerr = readNB(fd, p)
		switch {
		case rerr == errWouldBlock:
			r.setLowat(fd)
			return false // not ready: wait on the poller, then call again
		case rerr == nil:
			r.need = max(r.need-n, 0)
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	return n, rerr
}

// readNB reads the non-blocking descriptor fd once into p: the bytes read,
// or errWouldBlock when it has none now, io.EOF at the end of the stream,
// or the system call's error.
func readNB(fd uintptr, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		r1, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return 0, errWouldBlock
		case e != 0:
			return 0, os.NewSyscallError("read", e)
		case r1 == 0:
			return 0, io.EOF
		}
		return int(r1), nil
	}
}

// errWouldBlock is readNB's answer when the socket has nothing now. It is
// a temporary net.Error, so that crypto/tls, reading through a sniffConn in
// an event loop, keeps what it has of a record and survives it, as it
// survives a read deadline (evloop_tls.go).
var errWouldBlock net.Error = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "read would block" }
func (wouldBlock) Timeout() bool   { return true }
func (wouldBlock) Temporary() bool { return true }

// Wake-ups for a large frame's body. A peer whose large frame arrives in
// many pieces (a TLS sender writes each 16 KiB record by itself) would wake
// the reader for each: it found one record, read it and slept again, some
// 20 context switches for a 1 MiB item over TLS. While the rest of a body
// is still to come, the socket's SO_RCVLOWAT has the kernel wake the reader
// only once lowatMax bytes (or the whole rest) have arrived. A peer's FIN
// or an error still wakes it at once.
const (
	lowatMin = 64 << 10  // a rest below this waits as usual
	lowatMax = 256 << 10 // wake at most this many bytes apart
)

// expect tells r that at least n more bytes will reach its socket before
// the peer waits for anything from the daemon: the rest of a frame's body,
// less all that layers above the socket may hold of it already. It must be
// a lower bound: the reader waits for min(n, lowatMax) bytes, so a count
// too high would wait for bytes that never come. (A peer that stops short
// of the body it announced leaves the reader waiting, as reading the body
// does anyway.) Each Read counts what it took off it. n <= 0, at the
// body's end, sets the socket back at once: a connection handed to an
// event loop is waited on there with no further word.
func (r *rawIO) expect(n int) {
	if !r.tcp {
		return
	}
	r.need = max(n, 0)
	if r.need < lowatMin && r.lowat > 1 {
		_ = r.rc.Control(func(fd uintptr) { r.setLowat(fd) })
	}
}

// setLowat sets the socket's SO_RCVLOWAT for the wait about to start: the
// bytes still surely to come, up to lowatMax, or 1 once fewer than
// lowatMin are. A refusal leaves the socket as it was.
func (r *rawIO) setLowat(fd uintptr) {
	want := 1
	if r.need >= lowatMin {
		want = min(r.need, lowatMax)
	}
	if want == max(r.lowat, 1) {
		return
	}
	if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, want) == nil {
		r.lowat = want
	}
}

// writeBuffers writes every byte of bufs (one writev while the socket
// takes it all, as a net.Buffers write does).
func (r *rawIO) writeBuffers(bufs [][]byte) error {
	var errno syscall.Errno
	err := r.rc.Write(func(fd uintptr) bool {
		var again bool
		_, again, errno = writevNB(fd, &bufs)
		return !again // the socket's buffer is full: wait until it drains
	})
	if err != nil {
		return err
	}
	if errno != 0 {
		return os.NewSyscallError("writev", errno)
	}
	return nil
}

// writevNB writes bufs to the non-blocking descriptor fd, dropping what was
// written from them, until all is written, the socket would block (again)
// or a write fails (errno). It returns the bytes written.
func writevNB(fd uintptr, bufs *[][]byte) (n int, again bool, errno syscall.Errno) {
	var iov [maxIOV]unix.Iovec
	for len(*bufs) > 0 {
		k := 0
		for _, b := range *bufs {
			if k == len(iov) {
				break
			}
			if len(b) > 0 {
				iov[k].Base = &b[0]
				iov[k].SetLen(len(b))
				k++
			}
		}
		if k == 0 {
			*bufs = nil
			return n, false, 0
		}
		r1, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(k))
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return n, true, 0
		default:
			return n, false, e
		}
		n += int(r1)
		consume(bufs, int(r1))
	}
	return n, false, 0
}

// maxIOV is how many buffers one writev takes (a loop's replies to a
// pipelining client go out together, up to this many buffers a call).
const maxIOV = 64

// consume drops the first n written bytes from bufs.
func consume(bufs *[][]byte, n int) {
	for n > 0 && len(*bufs) > 0 {
		b := (*bufs)[0]
		if n < len(b) {
			(*bufs)[0] = b[n:]
			return
		}
		n -= len(b)
		*bufs = (*bufs)[1:]
	}
	for len(*bufs) > 0 && len((*bufs)[0]) == 0 {
		*bufs = (*bufs)[1:]
	}
}
