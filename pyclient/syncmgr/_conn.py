"""One authenticated connection to the daemon: its socket (Unix, TCP,
TLS with a CA or a pinned certificate), the handshake, and framed requests
and replies over it (:class:`Connection`).

The per-process client that pools these connections and makes calls on
them is ``_connection.Client``; socket and msgpack errors of a connection
become syncmgr exceptions here.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from typing import Any, Optional

import msgpack

from . import exceptions as exc
from ._framing import HEADER, ITEM_ALIGN, bin_reply, bin_start, frame, packb, sendmsg_all
from ._handshake import (
    _HANDSHAKE_MAX,
    Handshake,
    _HandshakeDropped,
    _no_ready,
    _NoReady,
)
from ._keys import looks_like_hex_text
from ._tls import TLSStream, check_pin, pinned_tls_context

CONNECT_TIMEOUT = 10.0
_header_from = HEADER.unpack_from
_unpackb = msgpack.unpackb  # (msgpack >= 1.0: str as str)
# A request whose pieces add up to at most this goes over TLS as one piece
# (see Connection._send).
_SSL_JOIN_MAX = 64 << 10
# The receive buffer: small at first, grown once to its full size by the
# first frame that needs it. A connection costs its process no 256 KiB
# zeroed (page-faulted) at its handshake, which is most of what a fresh
# process pays on its first calls; one that is given large replies
# (get_many of many items) has the full buffer from then on.
_RBUF_FIRST = 16 << 10
_RBUF_MAX = 256 << 10
# A request is small (large items go out of band), so a connection's Packer
# starts with a small buffer, not msgpack's 256 KiB (an mmap per
# connection), where the installed msgpack has the option: 1.1 and later
# (1.0, which Linux distributions ship, has neither it nor a smaller
# default).
try:
    msgpack.Packer(buf_size=4096)
    _PACKER_ARGS: dict[str, Any] = {"buf_size": 4096}
except TypeError:
    _PACKER_ARGS = {}

try:  # memory reused from one large reply to the next (no fresh pages to fault in)
    from ._fastpath import item_buffer as _item_buffer
except ImportError:  # no extension: the socket path alone
    _item_buffer = None


def _big_buffer(n: int) -> memoryview:
    """n writable bytes for a reply too large for the receive buffer, all
    of which the caller fills."""
    return memoryview(bytearray(n)) if _item_buffer is None else _item_buffer(n)


def default_address() -> str:
    """$SYNCMGR_ADDRESS, else the daemon's default socket path."""
    addr = os.environ.get("SYNCMGR_ADDRESS")
    if addr:
        return addr
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run:
        return os.path.join(run, "syncmgr.sock")
    # As the daemon (Go's os.TempDir): $TMPDIR, else /tmp.
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", f"syncmgr-{os.getuid()}", "syncmgr.sock")


class Connection:
    """One authenticated socket to the daemon."""

    def __init__(self, address: str, key: bytes, session: bytes, ssl_context: Optional[ssl.SSLContext] = None,
                 retry: bool = True, key_source: str = "", pin: Optional[str] = None, peer: str = "") -> None:
        """Connect and authenticate. With retry, a ``limit`` answer (the
        daemon's connection caps) and a connection the daemon drops during
        the handshake (its handshake budget is full) are tried again, after
        the daemon's retry hint or a short growing pause, within
        CONNECT_TIMEOUT; a wrong key is never tried again."""
        self.address = address
        self.key_source = key_source  # where the key came from, for an AuthenticationError
        self._key_is_hex_text = looks_like_hex_text(key)
        self.max_frame = 64 << 20
        self.boot_id = ""
        self.run_id = ""
        self.closed = False
        self.last_used = 0.0
        # Packs this connection's requests: a connection is used by one
        # thread at a time (taken from its client's pool).
        self.packb = msgpack.Packer(use_bin_type=True, **_PACKER_ARGS).pack
        self._rbuf = bytearray(_RBUF_FIRST)
        self._rview = memoryview(self._rbuf)
        deadline = time.monotonic() + CONNECT_TIMEOUT
        pause = 0.01
        while True:
            self._rstart = self._rend = 0
            self.closed = False
            self.sock = _connect(address, ssl_context, pin, peer)
            try:
                self._handshake(key, session, address not in _no_ready, deadline)
                return
            except _NoReady:
                self.close()
                _no_ready.add(address)  # a daemon older than the ready frame: once more without it
                continue
            except (exc.LimitError, _HandshakeDropped) as e:
                self.close()
                wait = getattr(e, "retry_after", 0.0) or pause
                pause = min(2 * pause, 0.5)
                if not retry or time.monotonic() + wait >= deadline:
                    raise
                time.sleep(wait)
            except BaseException:
                self.close()
                raise

    def _handshake(self, key: bytes, session: bytes, ready: bool, deadline: float) -> None:
        self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            if ready:
                # Speak first: the daemon then knows at once that this is a
                # client at work, not an idle connection holding a slot.
                self._send([frame(packb({"t": "ready"}))])
            hello = msgpack.unpackb(self._recv_frame(_HANDSHAKE_MAX), raw=False)
            shake = Handshake(self.address, key, session, self._key_hint())
            ns = shake.hello(hello, ready)
            self.max_frame = shake.max_frame
            self._send([frame(shake.auth(ns))])
            welcome = msgpack.unpackb(self._recv_frame(_HANDSHAKE_MAX), raw=False)
            self.boot_id, self.run_id = shake.welcome(welcome)
        except (exc.ServerGoneError, ConnectionResetError, BrokenPipeError) as e:
            # Closed before the handshake ended: the daemon dropped us to make
            # room (too many connections in the handshake) or is stopping.
            raise _HandshakeDropped(
                f"syncmgr at {self.address} closed the connection during the handshake: the server is busy "
                "(too many connections waiting to authenticate) or shutting down; try again"
            ) from e
        except (OSError, ValueError, msgpack.UnpackException) as e:
            if isinstance(e, exc.SyncMgrError):
                raise
            raise exc.ConnectError(f"handshake with syncmgr at {self.address} failed: {e}") from e
        self.sock.settimeout(None)

    def _key_hint(self) -> str:
        """What an authentication error adds: where the key came from, and
        the likely mistake of passing keygen's hex as bytes."""
        hint = f" (the key came from {self.key_source})" if self.key_source else ""
        if self._key_is_hex_text:
            hint += ("; the key given is hex digits as bytes: `syncmgr keygen` prints hex, so pass it as a str "
                     "(connect(address, key_hex)) or as bytes.fromhex(key_hex)")
        return hint

    def _send(self, buffers: list[Any]) -> None:
        if len(buffers) == 1:
            self.sock.sendall(buffers[0])
        elif isinstance(self.sock, TLSStream):
            # A TLS stream has no sendmsg: each sendall is records of its
            # own and a write(2) of its own, which the daemon may read as a
            # wake-up of its own. A request of small pieces (every batch)
            # goes as one record; a large item's pieces stay as they are,
            # its copy costing more than the records it saves.
            if sum(len(b) if isinstance(b, bytes) else memoryview(b).nbytes for b in buffers) <= _SSL_JOIN_MAX:
                self.sock.sendall(b"".join(buffers))
            else:
                for b in buffers:
                    self.sock.sendall(b)
        else:
            sendmsg_all(self.sock, buffers)

    def _fill(self) -> None:
        """Read what the socket has into the receive buffer (at least one byte)."""
        if self._rstart == self._rend:
            self._rstart = self._rend = 0
        elif self._rend == len(self._rbuf):  # compact
            rest = self._rend - self._rstart
            self._rbuf[:rest] = self._rbuf[self._rstart:self._rend]
            self._rstart, self._rend = 0, rest
        k = self.sock.recv_into(self._rview[self._rend:])
        if k == 0:
            raise exc.ServerGoneError(f"syncmgr at {self.address} closed the connection")
        self._rend += k

    def _recv_frame(self, limit: int) -> Any:
        """One frame body, as a memoryview. A frame that fits the receive
        buffer costs one recv (usually together with its header) and is a
        view of that buffer, valid until the next read; a larger one is read
        straight into a buffer of its own, placed so that the item of a
        one-item reply (bin_start) starts at a multiple of ITEM_ALIGN bytes
        past the buffer's start: the out-of-band buffers of an item
        (_values: numpy arrays) then lie as aligned as in the bytearray of a
        fast-path get."""
        while self._rend - self._rstart < 4:
            self._fill()
        (n,) = HEADER.unpack_from(self._rbuf, self._rstart)
        if n == 0 or n > limit:
            raise exc.ProtocolError(f"syncmgr at {self.address} sent a frame of {n} bytes")
        self._rstart += 4
        if n > len(self._rbuf) - self._rstart and n <= _RBUF_MAX:
            self._grow()
        if n <= len(self._rbuf) - self._rstart:
            while self._rend - self._rstart < n:
                self._fill()
            body = self._rview[self._rstart:self._rstart + n]
            self._rstart += n
            return body
        have = self._rend - self._rstart
        item = bin_start(self._rview[self._rstart:self._rend])
        pad = 0 if item is None else -item[1] % ITEM_ALIGN
        view = _big_buffer(pad + n)[pad:]
        view[:have] = self._rview[self._rstart:self._rend]
        self._rstart = self._rend = 0
        while have < n:
            k = self.sock.recv_into(view[have:])
            if k == 0:
                raise exc.ServerGoneError(f"syncmgr at {self.address} closed the connection")
            have += k
        return view

    def _grow(self) -> None:
        """Give the receive buffer its full size (_RBUF_MAX), the bytes
        read and not yet taken moved to its start. A new buffer, not the old
        one resized: a body returned earlier as a view of the old one stays
        valid."""
        if len(self._rbuf) >= _RBUF_MAX:
            return
        rest = self._rend - self._rstart
        buf = bytearray(_RBUF_MAX)
        buf[:rest] = self._rview[self._rstart:self._rend]
        self._rbuf, self._rview = buf, memoryview(buf)
        self._rstart, self._rend = 0, rest

    def send_requests(self, frames: list[list[Any]]) -> None:
        self._send(frames[0] if len(frames) == 1 else [b for f in frames for b in f])

    def recv_reply(self) -> tuple[int, Any, Any]:
        """The next reply: (request id, error, result)."""
        if self._rstart == self._rend:
            # The common case, inline: nothing read ahead, and the reply
            # comes whole in one read (it then lies at the buffer's start).
            buf = self._rbuf
            k = self.sock.recv_into(buf)
            if k == 0:
                raise exc.ServerGoneError(f"syncmgr at {self.address} closed the connection")
            if k >= 4:
                (n,) = _header_from(buf)
                if k == n + 4 and n:
                    self._rstart = self._rend = 0
                    try:
                        rid, err, result = _unpackb(self._rview[4:k])
                    except (ValueError, TypeError, msgpack.UnpackException) as e:
                        raise self._malformed(e) from None
                    return rid, err, result
            self._rstart, self._rend = 0, k
        body = self._recv_frame(self.max_frame + 4096)
        if body.obj is not self._rbuf:  # a large frame in a buffer of its own (never reused)
            fast = bin_reply(body)
            if fast is not None:
                return fast
        return self._unpack_reply(body)

    def _unpack_reply(self, body: Any) -> tuple[int, Any, Any]:
        try:
            rid, err, result = _unpackb(body)
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise self._malformed(e) from None
        return rid, err, result

    def _malformed(self, e: Exception) -> exc.ProtocolError:
        return exc.ProtocolError(f"malformed reply from syncmgr at {self.address}: {e}")

    def recv_reply_with_fds(self, maxfds: int) -> tuple[int, Any, Any, list[int]]:
        """The next reply, as recv_reply gives it, and the descriptors that
        came with it (SCM_RIGHTS, up to maxfds a read; Unix sockets only).
        The caller closes them; if this raises, they are closed here.

        Descriptors ride on the reply's first bytes, which only recvmsg
        receives, so nothing may have been read ahead of the reply (else
        ProtocolError), and this reads the reply's bytes and no more: what
        the daemon sends after it stays in the socket for whoever reads
        there next. A reply with descriptors fits the receive buffer."""
        if self._rstart != self._rend:
            raise exc.ProtocolError(f"unexpected bytes before a reply from syncmgr at {self.address}")
        sock = self.sock
        if isinstance(sock, TLSStream):
            raise exc.ProtocolError(f"descriptors come only over a Unix socket, not from {self.address}")
        self._rstart = self._rend = 0
        fds: list[int] = []
        try:
            need = 4
            while self._rend < need:
                data, got, _, _ = socket.recv_fds(sock, need - self._rend, maxfds)
                fds += got
                if not data:
                    raise exc.ServerGoneError(f"syncmgr at {self.address} closed the connection")
                self._rbuf[self._rend:self._rend + len(data)] = data
                self._rend += len(data)
                if need == 4 and self._rend == 4:
                    (n,) = HEADER.unpack_from(self._rbuf, 0)
                    if n > len(self._rbuf) - 4:
                        self._grow()
                    if n > len(self._rbuf) - 4:
                        raise exc.ProtocolError(f"syncmgr at {self.address} sent a frame of {n} bytes")
                    need += n
            rid, err, result = self.recv_reply()
            return rid, err, result, fds
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


def _idle_check(conn: Connection) -> tuple[bool, Optional[exc.SyncMgrError]]:
    """Whether an idle pooled connection is still usable, and the error the
    daemon sent on it unasked, if any: a daemon that stops gracefully tells
    every connection so (an error frame with request id 0, code
    ``shutting_down``) before closing it. Reads only what is there (pooled
    sockets are in blocking mode, so MSG_DONTWAIT is honoured)."""
    read = bytes(conn._rview[conn._rstart:conn._rend])  # read with an earlier reply, not yet looked at
    if read:
        return False, _notice_in(read)
    sock = conn.sock
    if isinstance(sock, TLSStream):
        return True, None  # no peeking under TLS; a dead one fails on use
    try:
        if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
            return False, None
        data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True, None
    except (OSError, ValueError):
        return False, None
    return False, _notice_in(data)


def _notice_in(data: bytes) -> Optional[exc.SyncMgrError]:
    """The error of an unasked reply (request id 0) at the start of data, if
    data holds a whole one."""
    if len(data) < 4:
        return None
    n = int.from_bytes(data[:4], "big")
    if len(data) < 4 + n:
        return None
    try:
        rid, err, _ = msgpack.unpackb(data[4:4 + n], raw=False)
        if rid == 0 and err:
            return exc.from_code(str(err[0]), str(err[1]))
    except (ValueError, TypeError, IndexError, msgpack.UnpackException):
        pass
    return None


def _check_server_uid(sock: socket.socket, address: str) -> None:
    """Refuse a Unix socket whose listener runs as another user than ours or
    root (SO_PEERCRED), before sending anything: another user could have put
    their socket at the path to capture the handshake. $SYNCMGR_SERVER_UID
    names one more uid to accept (a daemon shared with --allow-other-users)."""
    if not hasattr(socket, "SO_PEERCRED"):  # pragma: no cover - not Linux
        return
    import struct

    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    allowed = {os.geteuid(), 0}
    extra = os.environ.get("SYNCMGR_SERVER_UID", "")
    if extra.isdigit():
        allowed.add(int(extra))
    if uid not in allowed:
        raise exc.ConnectError(
            f"the syncmgr socket at {address} belongs to a process of uid {uid}, not ours ({os.geteuid()}): refusing "
            "to talk to it (set SYNCMGR_SERVER_UID to that uid if the daemon is shared on purpose)"
        )


def _connect(address: str, ssl_context: Optional[ssl.SSLContext], pin: Optional[str] = None,
             peer: str = "") -> socket.socket | TLSStream:
    try:
        if address.startswith("tcp://"):
            hostport = address[len("tcp://"):]
            host, _, port = hostport.rpartition(":")
            host = host.strip("[]")
            sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                if pin is not None:
                    tls = TLSStream(sock, ssl_context or pinned_tls_context())
                    check_pin(tls, pin, address, peer)
                    return tls
                if ssl_context is not None:
                    name = os.environ.get("SYNCMGR_TLS_SERVER_NAME") or host
                    return TLSStream(sock, ssl_context, server_hostname=name)
            except BaseException:
                sock.close()
                raise
            return sock
        path = address[len("unix://"):] if address.startswith("unix://") else address
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
            _check_server_uid(sock, address)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            sock.close()
            raise exc.ConnectError(
                f"no syncmgr daemon is running at {address} ({e.strerror}): start one with `syncmgr serve"
                f"{'' if path == default_address() else ' --socket ' + path}` (or use syncmgr.Manager() for a "
                "private one), or set SYNCMGR_ADDRESS to a running daemon's address"
            ) from e
        except BaseException:
            sock.close()
            raise
        return sock
    except (OSError, ValueError) as e:
        raise exc.ConnectError(f"cannot connect to syncmgr at {address}: {e}") from e
